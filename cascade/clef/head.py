"""Clef's joint schema head (spec §1.6), written from the spec and batched over records.

The parameter tree matches ``joint_head.safetensors`` exactly (names and shapes), so a
release loads with ``load_state_dict(..., strict=True)``. Unlike the reference, which loops
over records, ``forward`` runs a whole right-padded batch at once: span means are segment
means over gathered positions, the routing softmax is a per-question segment softmax, and
every attention over the backbone memory masks the padding (``key_padding_mask``), which
is equivalent to the reference's slicing ``hidden[b, :length]``. Inference only: dropout
is never applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cascade.clef.layout import Layout

LOG_100 = math.log(100.0)


class SpannedQuestion(Protocol):
    """One question's place in the prompt: end-exclusive absolute token spans."""

    question_type: int  # 0 noul, 1 choice, 2 score (row of type_embedding)
    question_span: tuple[int, int]
    option_spans: tuple[tuple[int, int], ...]


class EvidenceRoutingLayer(nn.Module):
    """Options cross-attend to the whole prompt (no self-attention), then a feed-forward."""

    def __init__(self, width: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.feedforward_norm = nn.LayerNorm(width)
        # Indices 0 and 3 carry weights, as in the release (1 is GELU, 2 was dropout).
        self.feedforward = nn.Sequential(
            nn.Linear(width, feedforward), nn.GELU(), nn.Identity(), nn.Linear(feedforward, width)
        )

    def forward(self, queries: Tensor, memory: Tensor, memory_padding: Tensor) -> Tensor:
        keys = self.memory_norm(memory)
        routed, _ = self.attention(
            self.query_norm(queries),
            keys,
            keys,
            key_padding_mask=memory_padding,
            need_weights=False,
        )
        queries = queries + routed
        return queries + self.feedforward(self.feedforward_norm(queries))


class JointSchemaHead(nn.Module):
    """Scores every option of every question from the backbone's last hidden states.

    Constructor arguments are the keys of ``joint_head_config.json`` (``dropout`` is
    accepted and ignored: inference only).
    """

    def __init__(
        self,
        hidden_size: int,
        width: int,
        routing_layers: int,
        layers: int,
        heads: int,
        feedforward: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.hidden_norm = nn.LayerNorm(hidden_size)
        self.memory_projection = nn.Linear(hidden_size, width, bias=False)
        self.question_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_question_projection = nn.Linear(hidden_size, width, bias=False)
        self.global_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_context_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_lexical_projection = nn.Linear(hidden_size, width, bias=False)
        self.type_embedding = nn.Embedding(3, width)
        self.evidence_layers = nn.ModuleList(
            EvidenceRoutingLayer(width, heads, feedforward) for _ in range(routing_layers)
        )
        self.option_summary_norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                width,
                heads,
                feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.field_norm = nn.LayerNorm(width)
        self.option_norm = nn.LayerNorm(width)
        self.residual_scorer = nn.Sequential(
            nn.Linear(4 * width, width), nn.GELU(), nn.Identity(), nn.Linear(width, 1)
        )
        self.prior_logit_scale = nn.Parameter(torch.zeros(()))
        self.joint_logit_scale = nn.Parameter(torch.zeros(()))
        self.residual_gate = nn.Parameter(torch.zeros(()))

    def forward(
        self,
        hidden: Tensor,
        input_ids: Tensor,
        lengths: Tensor,
        records: Sequence[Sequence[SpannedQuestion]],
        output_embedding: Tensor,
    ) -> list[list[Tensor]]:
        """Logits per record, per question, one per option in prompt order.

        ``hidden`` [B, L, H] is the backbone's final (normed) hidden state of a right-padded
        batch whose rows hold ``lengths`` real tokens; ``output_embedding`` is ``lm_head``'s
        weight [V, H]. Computation runs in the head's own dtype.
        """
        dtype = self.hidden_norm.weight.dtype
        batch, length, _ = hidden.shape
        lay = Layout.build(records, lengths, length, hidden.device)
        h = self.hidden_norm(hidden.to(dtype))
        memory = self.memory_projection(h)
        padding = torch.arange(length, device=h.device)[None, :] >= lengths[:, None]

        pooled = lay.segment_mean(h.reshape(batch * length, -1))
        questions, contexts = pooled[: lay.n_questions], pooled[lay.n_questions :]
        lexical = lay.option_mean(
            output_embedding[input_ids.reshape(-1)[lay.option_positions]].to(dtype)
        )
        glob = h[torch.arange(batch, device=h.device), lengths - 1]

        queries = (
            self.option_context_projection(contexts)
            + self.option_lexical_projection(lexical)
            + self.option_question_projection(questions)[lay.option_question]
        )
        routed = lay.pad_options(queries)
        for layer in self.evidence_layers:
            routed = layer(routed, memory, padding)
        options = routed[lay.option_record, lay.option_slot]

        base = self.question_projection(questions)
        scores = (options * base[lay.option_question]).sum(-1) / math.sqrt(options.shape[-1])
        weights = lay.segment_softmax(scores)
        summary = torch.zeros_like(base).index_add_(
            0, lay.option_question, weights[:, None] * options
        )
        fields = (
            base
            + self.option_summary_norm(summary)
            + self.global_projection(glob)[lay.question_record]
            + self.type_embedding(lay.question_types)
        )
        fields = lay.pad_questions(fields)
        for layer in self.layers:
            fields = layer(
                fields,
                memory,
                tgt_key_padding_mask=lay.question_padding,
                memory_key_padding_mask=padding,
            )
        fields = self.field_norm(fields[lay.question_record, lay.question_slot])

        anchor = F.normalize(questions + glob[lay.question_record], dim=-1)
        prior_scale = self.prior_logit_scale.clamp(max=LOG_100).exp()
        prior = prior_scale * (F.normalize(lexical, dim=-1) * anchor[lay.option_question]).sum(-1)
        field = fields[lay.option_question]
        normed = self.option_norm(options)
        cosine = F.cosine_similarity(field, normed, dim=-1)
        features = torch.cat([field, normed, field * normed, (field - normed).abs()], dim=-1)
        residual = self.residual_scorer(features).squeeze(-1)
        joint = self.joint_logit_scale.clamp(max=LOG_100).exp() * cosine + residual
        logits = prior + torch.sigmoid(self.residual_gate) * joint
        return lay.split(logits)
