"""How closely two GPU results that should agree must agree, by dtype; never bit for bit, since two runs of the same
function on a GPU need not use the same kernels (a graph replay, another batch size or SM partition picks another
GEMM split and accumulates in another order).

bfloat16 keeps 8 significant bits: a rounding moves a value by up to half of BF16_EPS (2**-8) of it, and every layer
rounds its products and its sums once more, so two orders of accumulation through a few layers differ by a few
BF16_EPS: 12 of them (0.047) relative, and as much absolute for values near zero. float32 keeps 24 bits; its 1e-4 is
about 800 FP32_EPS, the sums of thousands of terms in another order. Greedy text is compared by the share of tokens
two runs chose alike: a choice flips wherever the two best logits lie closer than those differences, which a random
model's near-ties make rare in float32 and less rare in bfloat16."""

import torch

BF16_EPS = 2.0 ** -8
FP32_EPS = 2.0 ** -23
TOLERANCE = {torch.bfloat16: {"rtol": 12 * BF16_EPS, "atol": 12 * BF16_EPS},
             torch.float32: {"rtol": 1e-4, "atol": 1e-4}}
MIN_AGREEMENT = {torch.bfloat16: 0.8, torch.float32: 0.95}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return TOLERANCE[dtype]


def token_agreement(got: dict, want: dict) -> float:
    """Of the greedy tokens in `want` (request -> token ids), the share `got` chose alike, each request counted up
    to its first difference (after it the two continue different texts, so their later tokens are no comparison)."""
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    alike = total = 0
    for key, tokens in want.items():
        total += len(tokens)
        for a, b in zip(got[key], tokens):
            if a != b:
                break
            alike += 1
    return alike / max(total, 1)


def assert_texts_agree(got: dict, want: dict, dtype: torch.dtype) -> None:
    share = token_agreement(got, want)
    assert share >= MIN_AGREEMENT[dtype], f"{share:.2f} of the greedy tokens alike (at least {MIN_AGREEMENT[dtype]})"
