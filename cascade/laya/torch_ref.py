"""A torch forward of a Laya checkpoint, the reference the ONNX export is checked against.

The encoder is transformers' ``ModernBertModel`` (eager attention) built from our parsed
``EncoderConfig``; the decision head, scorer and act head are written here from spec §2.6-§2.7.
``logits`` is differentiable: ``tensors()`` names every weight as the checkpoint does, so
``cascade distill`` trains this graph and writes the weights back under the same names.
Needs the ``export`` extra (torch, transformers); never imported by the serving path.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import ModernBertConfig, ModernBertModel

from cascade.laya.config import LayaConfig


def _encoder(cfg: LayaConfig, weights: dict[str, np.ndarray]) -> ModernBertModel:
    e = cfg.encoder
    config = ModernBertConfig(
        vocab_size=e.vocab,
        hidden_size=e.hidden,
        intermediate_size=e.intermediate,
        num_hidden_layers=e.layers,
        num_attention_heads=e.heads,
        norm_eps=e.norm_eps,
        local_attention=e.window,
        max_position_embeddings=e.max_positions,
        layer_types=["full_attention" if g else "sliding_attention" for g in e.global_layers],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": e.global_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": e.local_theta},
        },
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        cls_token_id=None,
        sep_token_id=None,
        # transformers' @strict configs take PreTrainedConfig's keywords at runtime
        # (wrap_init_to_accept_kwargs), which their dataclass signature does not show.
        attn_implementation="eager",  # type: ignore[call-arg]
    )
    model = ModernBertModel(config).eval()
    state = {
        k.removeprefix("encoder."): torch.from_numpy(v)
        for k, v in weights.items()
        if k.startswith("encoder.")
    }
    model.load_state_dict(state, strict=True)
    return model


class TorchLaya:
    """``forward(feeds) -> (logits, act_logits)`` as numpy, in fp32 on the CPU; ``logits`` is
    the same graph on tensors, with autograd."""

    def __init__(self, cfg: LayaConfig, weights: dict[str, np.ndarray]) -> None:
        self.cfg = cfg
        # Used as a Module only: typeshed's functools.wraps does not bind ``self`` in
        # transformers' ``PreTrainedModel.to``, so that method is not callable as typed.
        self.encoder: torch.nn.Module = _encoder(cfg, weights)
        self.w = {
            k: torch.from_numpy(v) for k, v in weights.items() if not k.startswith("encoder.")
        }

    def _attention(self, h: torch.Tensor, p: str, pad: torch.Tensor) -> torch.Tensor:
        d = h.shape[-1]
        heads = max(1, d // 64)
        q, k, v = F.linear(h, self.w[p + "in_proj_weight"], self.w[p + "in_proj_bias"]).chunk(3, -1)
        q, k, v = (t.unflatten(-1, (heads, d // heads)).transpose(1, 2) for t in (q, k, v))
        mask = torch.zeros(pad.shape, dtype=h.dtype, device=h.device).masked_fill(pad, -torch.inf)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        out = out.transpose(1, 2).flatten(2)
        return F.linear(out, self.w[p + "out_proj.weight"], self.w[p + "out_proj.bias"])

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"], 1e-5)

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight under its checkpoint name (the live tensors, not copies)."""
        encoder = {"encoder." + k: v for k, v in self.encoder.named_parameters()}
        return encoder | self.w

    def to(self, device: torch.device | str) -> TorchLaya:
        """Move every weight to ``device`` in place (the weights stay leaves)."""
        self.encoder.to(device)
        self.w = {k: v.to(device).detach() for k, v in self.w.items()}
        return self

    @torch.no_grad()
    def forward(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        logits, act = self.logits({k: torch.from_numpy(v) for k, v in feeds.items()})
        return logits.numpy(), act.numpy()

    @torch.no_grad()
    def pooled(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The encoder's output averaged over each row's tokens (the export's ``pooled``)."""
        mask = torch.from_numpy(feeds["attention_mask"])
        h = self.encoder(
            input_ids=torch.from_numpy(feeds["input_ids"]), attention_mask=mask
        ).last_hidden_state
        m = mask[:, :, None].to(h.dtype)
        return ((h * m).sum(1) / m.sum(1)).numpy()

    def logits(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Option logits (``-1e4`` past each row's markers) and act logits, on tensors."""
        h = self.encoder(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"]
        ).last_hidden_state
        h = h + self.w["type_emb.weight"][t["qtype"]][:, None, :]
        pad = ~t["attention_mask"].bool()
        for j in range(self.cfg.head_layers):
            p = f"head.layers.{j}."
            h = h + self._attention(self._ln(h, p + "norm1"), p + "self_attn.", pad)
            h = h + self._lin(
                F.relu(self._lin(self._ln(h, p + "norm2"), p + "linear1")), p + "linear2"
            )
        idx = t["marker_pos"][:, :, None].expand(-1, -1, h.shape[-1])
        m = torch.gather(h, 1, idx)
        logits = self._lin(F.gelu(self._lin(self._ln(m, "scorer.0"), "scorer.1")), "scorer.3")
        logits = logits.squeeze(-1).masked_fill(~t["marker_mask"], -1e4)
        probs = torch.softmax(logits, -1)
        k = t["marker_mask"].sum(-1).clamp(min=2).to(h.dtype)
        ent = -(probs * torch.log(probs.clamp_min(1e-9))).sum(-1) / torch.log(k)
        top = probs.topk(2, -1).values
        feats = torch.stack([top[:, 0], top[:, 0] - top[:, 1], ent, k / 255.0], -1)
        act = self._lin(
            F.gelu(self._lin(torch.cat([h[:, 0], feats], -1), "act_head.0")), "act_head.2"
        )
        return logits, act
