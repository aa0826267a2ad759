"""The pi0.5 training losses, differentiable, over the same layers and attention pattern inference uses.

- Action loss (flow matching, as openpi / LeRobot train pi0.5): per sample a time t ~ Beta(1.5, 1) * 0.999 + 0.001
  and Gaussian noise; the expert sees x_t = t * noise + (1 - t) * actions and is regressed (mean squared error)
  onto the velocity u = noise - actions, which `sample_actions` integrates from t = 1 down to t = 0.
- Text loss: next-token cross-entropy on a caption that follows the prompt, as `decode_step` generates it: caption
  token n sits after the prefix at RoPE position `num_valid + n` and attends to the valid prefix and to the caption
  tokens before it; the last valid prefix token predicts the first caption token and the last caption token EOS.

The prefix rows never attend to the caption, so the prefix K/V the expert reads is the one `prefill` caches.

Training-time real-time chunking (Black, Ren, Equi, Levine 2025, arXiv 2512.05964; `rtc_max_delay` > 0): per
sample a simulated delay d, uniform in 0..rtc_max_delay; the chunk's first d actions are given as known (clean, with
the time of finished actions, t = 0, in their per-token condition) and the loss covers the other actions only. A
model trained so continues a committed prefix by itself (`model/rtc.py`, `method="prefix"`), without the guided
sampler's backward passes. LeRobot's `apply_rtc_training_time` reads it the same way (prefix time 0, loss mask on
the postfix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .gemma import attend, prefix_attention_bias, rope_cos_sin
from .inputs import ModelInputs
from .pi05 import Pi05Model
from .prompt import NUM_STATE_BINS
from .tokenizer import Tokenizer

BETA_ALPHA = 1.5  # Beta(1.5, 1)
TIME_SCALE, TIME_OFFSET = 0.999, 0.001


@dataclass
class Losses:
    action: Tensor  # flow-matching mean squared error, scalar
    text: Tensor  # mean next-token cross-entropy over caption tokens and their EOS, scalar


def sample_times(batch: int, generator: torch.Generator | None = None) -> Tensor:
    """Flow-matching times [B] in [0.001, 1], weighted towards the noisy end as pi0 does.

    Beta(a, 1) has the CDF x**a, so u**(1/a) with u uniform samples it exactly from a seeded generator.
    """
    beta = torch.rand(batch, generator=generator) ** (1.0 / BETA_ALPHA)
    return beta * TIME_SCALE + TIME_OFFSET


def token_times(t: Tensor, delays: Tensor, horizon: int) -> Tensor:
    """Per-token flow-matching times [B, horizon]: each sample's time t, 0 (finished) over its first `delays`."""
    known = torch.arange(horizon)[None, :] < delays[:, None]
    return torch.where(known, torch.zeros(()), t[:, None].expand(-1, horizon))


def prefix_with_caption(model: Pi05Model, inputs: ModelInputs, caption: Tensor, caption_mask: Tensor):
    """Backbone over [prefix ; caption]: per-layer prefix K/V, prefix validity and the text logits.

    Logits are for the last valid prefix token followed by every caption position: [B, 1 + C, vocab].
    """
    cfg = model.config
    x, valid = model.embed_prefix(inputs)
    length, c = x.shape[1], caption.shape[1]
    num_valid = valid.sum(dim=1)
    x = torch.cat([x, model.backbone.embed(caption)], dim=1)
    positions = torch.cat([valid.long().cumsum(dim=1) - 1, num_valid[:, None] + torch.arange(c)], dim=1)
    cos, sin = rope_cos_sin(positions, cfg.backbone.head_dim, cfg.rope_theta, x.dtype)
    # Prefix rows: the valid prefix (padding rows see themselves). Caption rows: the valid prefix, then causal.
    total = length + c
    keys_valid = torch.cat([valid, caption_mask.bool()], dim=1)
    causal = torch.ones(c, c, dtype=torch.bool).tril()
    mask = torch.zeros(x.shape[0], total, total, dtype=torch.bool)
    mask[:, :length, :length] = valid[:, None, :] & valid[:, :, None]
    mask[:, length:, :length] = valid[:, None, :]
    mask[:, length:, length:] = causal[None] & keys_valid[:, None, length:]
    mask |= torch.eye(total, dtype=torch.bool)
    prefix_k, prefix_v = [], []
    for layer in model.backbone.layers:
        q, k, v, gate = layer.project_qkv(x, None, cos, sin)
        prefix_k.append(k[:, :, :length])
        prefix_v.append(v[:, :, :length])
        x = layer.finish(x, attend(q, k, v, mask[:, None]), gate, None)
    last = length - 1 - valid.flip(1).long().argmax(dim=1)
    rows = torch.arange(x.shape[0])
    text_hidden = torch.cat([x[rows, last][:, None], x[:, length:]], dim=1)
    return torch.stack(prefix_k), torch.stack(prefix_v), valid, model.backbone.logits(text_hidden).float()


def object_position_loss(model: Pi05Model, head: torch.nn.Linear, images: Tensor, positions: Tensor) -> Tensor:
    """The vision tower alone: a linear read-out `head` of the mean of its tokens for images [B, 3, H, W] against
    the object's normalised position [B, k] (mean squared error). What the tower learns here is in every one of its
    tokens, so the backbone finds it whichever tokens it attends to."""
    return F.mse_loss(head(model.vision(images).mean(dim=1)), positions)


def training_losses(
    model: Pi05Model,
    inputs: ModelInputs,
    actions: Tensor,
    caption: Tensor,
    caption_mask: Tensor,
    generator: torch.Generator | None = None,
    rtc_max_delay: int = 0,
) -> Losses:
    """Both losses for a batch (CPU tensors).

    actions [B, horizon, action_dim] normalised and zero-padded; caption [B, C] token ids right-padded with PAD,
    caption_mask [B, C] bool (a sample may have an empty caption: then only its EOS is learned). `rtc_max_delay`:
    training-time real-time chunking's largest simulated delay (0: none; below the horizon).
    """
    cfg = model.config
    b = actions.shape[0]
    if tuple(actions.shape[1:]) != (cfg.action_horizon, cfg.action_dim):
        raise ValueError(f"actions must be [B, {cfg.action_horizon}, {cfg.action_dim}], got {tuple(actions.shape)}")
    if not 0 <= rtc_max_delay < cfg.action_horizon:
        raise ValueError(f"rtc_max_delay must be in 0..{cfg.action_horizon - 1} (below the horizon), got "
                         f"{rtc_max_delay}")
    prefix_k, prefix_v, valid, logits = prefix_with_caption(model, inputs, caption, caption_mask)

    lengths = caption_mask.long().sum(dim=1)
    targets = torch.cat([caption, torch.full((b, 1), cfg.pad_id, dtype=caption.dtype)], dim=1)
    targets[torch.arange(b), lengths] = cfg.eos_id
    target_mask = torch.arange(targets.shape[1])[None, :] <= lengths[:, None]
    text = F.cross_entropy(logits[target_mask], targets[target_mask])

    noise = torch.randn(actions.shape, generator=generator)
    t = sample_times(b, generator)
    horizon = cfg.action_horizon
    if rtc_max_delay:  # the first d actions known: clean, finished (t = 0), not learned
        delays = torch.randint(rtc_max_delay + 1, (b,), generator=generator)
        times = token_times(t, delays, horizon)
        learned = torch.arange(horizon)[None, :] >= delays[:, None]
        cond = model.time_condition(times.reshape(-1)).view(b, horizon, -1)
    else:
        times, learned, cond = t[:, None].expand(-1, horizon), None, model.time_condition(t)
    x_t = times[..., None] * noise + (1.0 - times[..., None]) * actions
    positions = valid.sum(dim=1)[:, None] + torch.arange(horizon)
    cos, sin = rope_cos_sin(positions, cfg.expert.head_dim, cfg.rope_theta, model.dtype)
    bias = prefix_attention_bias(valid, cfg.expert.num_heads // cfg.expert.num_kv_heads, horizon, model.dtype)
    velocity = model._velocity(x_t, cond, prefix_k, prefix_v, bias, cos, sin)
    if learned is None:
        return Losses(action=F.mse_loss(velocity, noise - actions), text=text)
    return Losses(action=F.mse_loss(velocity[learned], (noise - actions)[learned]), text=text)


def order_number_embeddings(model: Pi05Model, tokenizer: Tokenizer, count: int = NUM_STATE_BINS) -> int:
    """Give the backbone's embeddings of the numbers 0..count-1 (each a single token) an order: row n becomes
    sines and cosines of n at periods from 2 to 2 * count, scaled to the random rows' size, so that neighbouring
    numbers start alike and a linear map reads a number's size. A stand-in for the numeracy of the pretrained
    language model a real pi0.5 starts from: its prompt gives the state as bin numbers, and a backbone trained
    from scratch otherwise learns each bin's meaning on its own from the frames that show it (`docs/sim.md`).
    Numbers the tokenizer splits into several tokens are left as they are. Returns how many rows were set."""
    embedding = model.backbone.embed_tokens.weight
    width = embedding.shape[1]
    pairs = width // 2
    periods = 2.0 * count ** (torch.arange(pairs, dtype=torch.float64) / max(1, pairs - 1))
    scale = math.sqrt(2.0) * float(embedding.detach().std())  # the random rows' size, before any row is replaced
    rows = 0
    with torch.no_grad():
        for number in range(count):
            ids = tokenizer.encode(str(number))
            if len(ids) != 1:
                continue
            angle = 2.0 * math.pi * number / periods
            code = torch.zeros(width, dtype=torch.float64)
            code[: 2 * pairs] = torch.stack([angle.sin(), angle.cos()], dim=1).reshape(-1)
            embedding[ids[0]] = (code * scale).to(embedding.dtype)
            rows += 1
    return rows
