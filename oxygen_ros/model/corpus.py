"""A small, deterministic English corpus of robot instructions and narration, for training stand-in tokenizers.

The real PaliGemma tokenizer cannot ship with this package. Random-init presets still need a tokenizer whose
vocabulary size matches the model, and tests need one that is built the same way every time, so we compose
sentences from fixed word lists in a fixed order (no randomness) and train SentencePiece on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product

VERBS = (
    "pick up",
    "put down",
    "place",
    "move",
    "push",
    "pull",
    "open",
    "close",
    "grasp",
    "release",
    "lift",
    "lower",
    "rotate",
    "turn",
    "slide",
    "stack",
    "unstack",
    "pour",
    "wipe",
    "fold",
    "unfold",
    "insert",
    "remove",
    "hand over",
    "carry",
    "drop",
    "sort",
    "arrange",
    "flip",
    "press",
    "hang",
    "store",
)
OBJECTS = (
    "red cube",
    "blue cube",
    "green block",
    "yellow cup",
    "white mug",
    "black bowl",
    "metal spoon",
    "wooden spatula",
    "plastic bottle",
    "glass jar",
    "paper towel",
    "cardboard box",
    "small plate",
    "large pot",
    "frying pan",
    "kitchen knife",
    "soda can",
    "banana",
    "apple",
    "orange",
    "tomato",
    "carrot",
    "sponge",
    "cloth",
    "shirt",
    "towel",
    "drawer",
    "cabinet door",
    "microwave",
    "oven door",
    "faucet",
    "light switch",
    "marker",
    "eraser",
    "notebook",
    "book",
    "pencil case",
    "stapler",
    "remote control",
    "phone",
    "charger",
    "cable",
    "screwdriver",
    "hammer",
    "wrench",
    "toy car",
    "stuffed bear",
    "lego brick",
    "basket",
    "tray",
    "lid",
    "kettle",
    "teapot",
)
PLACES = (
    "on the table",
    "in the sink",
    "on the shelf",
    "in the drawer",
    "into the basket",
    "onto the plate",
    "next to the bowl",
    "behind the box",
    "in front of the robot",
    "to the left side",
    "to the right side",
    "on the counter",
    "inside the cabinet",
    "on top of the stack",
    "near the window",
    "under the lamp",
)
NARRATION = (
    "I see the {obj} {place}.",
    "I am reaching for the {obj}.",
    "The gripper is closing around the {obj}.",
    "The {obj} slipped, trying again.",
    "Moving the {obj} {place} now.",
    "The task is done.",
    "I cannot find the {obj}, looking around.",
    "Carefully aligning the {obj} before release.",
)


def sentences() -> Iterator[str]:
    """Every sentence of the corpus, in a fixed order."""
    for verb, obj, place in product(VERBS, OBJECTS, PLACES):
        yield f"{verb} the {obj} {place}"
    for template, obj, place in product(NARRATION, OBJECTS, PLACES):
        yield template.format(obj=obj, place=place)
    # pi0.5 writes the discretised robot state into the prompt as integers 0..255.
    for start in range(0, 256, 8):
        state = " ".join(str((start + 37 * i) % 256) for i in range(8))
        for verb, obj in product(VERBS[:8], OBJECTS[:8]):
            yield f"Task: {verb} the {obj}, State: {state};\nAction: "
