"""Pure pre-routing for Laya: which checkpoint reads a call, and what its rows will cost.

``Previewer`` holds each configured checkpoint's config and tokenizer (no ONNX session), so
``cascade route`` and the policy engine can ask, before any inference, which checkpoint a call
goes to, whether it reads the state's script, and how each question's row is truncated.
``plan`` is the same work in full (validated questions and assembled rows); ``LayaEngine`` runs it.

Checkpoint choice: an explicit ``checkpoint`` argument, else ``call.model`` naming a configured
checkpoint, one of Laya's aliases or published hub ids (any case), else ``controls.task`` naming
typed decisions, else ``controls.lang`` (``en`` -> english, any other language ->
multilingual), else script detection (non-Latin -> multilingual), else the default. A name or
alias whose checkpoint is not configured falls through to the automatic choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from cascade.calls import CallPreview, EngineCall, RowPreview
from cascade.errors import UnknownModel
from cascade.laya.config import LayaConfig, load_config
from cascade.laya.questions import Prepared, prepare
from cascade.laya.rows import Row, build_rows
from cascade.laya.script import dominant_script
from cascade.laya.tokenizer import LayaTokenizer

ALIASES = {
    "english": "english",
    "en": "english",
    "laya": "english",
    "default": "english",
    "multilingual": "multilingual",
    "multi": "multilingual",
    "ml": "multilingual",
    "laya-multilingual": "multilingual",
    "typed-decisions": "typed-decisions",
    "typed": "typed-decisions",
    "typed_decisions": "typed-decisions",
    "laya-typed-decisions": "typed-decisions",
    "decisions": "typed-decisions",
}
# Laya's published Hugging Face ids name a checkpoint, as laya-serve reads them; the bundle's id
# (convaiinnovations/laya) names none: the automatic choice.
PUBLISHED = {
    "convaiinnovations/laya-multilingual": "multilingual",
    "convaiinnovations/laya-typed-decisions": "typed-decisions",
}
LATIN_ONLY_SCRIPTS = ("latin", "unknown")


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything inference needs for one call on one checkpoint."""

    checkpoint: str
    script: str
    readable: bool
    questions: list[Prepared]
    rows: list[Row]
    state_tokens: int


class PreviewCheckpoint:
    """A configured checkpoint's name, directory, config and tokenizer."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, Path(path)
        self.cfg: LayaConfig = load_config(self.path)
        self.tok = LayaTokenizer(self.path / "tokenizer")
        self.multilingual = name == "multilingual" or "mmbert" in self.cfg.encoder_id.lower()


class Previewer:
    """Tokenizers and configs of the configured checkpoints; thread-safe, no inference."""

    def __init__(self, checkpoints: Mapping[str, Path], default: str | None = None) -> None:
        if not checkpoints:
            raise ValueError("at least one Laya checkpoint must be configured")
        self.checkpoints = {
            name: PreviewCheckpoint(name, path) for name, path in checkpoints.items()
        }
        if default is not None and default not in self.checkpoints:
            raise ValueError(f"default checkpoint {default!r} is not configured")
        self.default = default or (
            "english" if "english" in self.checkpoints else next(iter(self.checkpoints))
        )

    def _named(self, name: str | None) -> str | None:
        if name is None:
            return None
        if name in self.checkpoints:
            return name
        key = name.strip().lower()
        alias = ALIASES.get(key) or PUBLISHED.get(key)
        return alias if alias in self.checkpoints else None

    def choose(self, call: EngineCall, checkpoint: str | None = None) -> tuple[str, str]:
        """``(checkpoint name, dominant script)`` for ``call``."""
        script, needs_multilingual = dominant_script(call.state)
        if checkpoint is not None:
            if checkpoint not in self.checkpoints:
                raise UnknownModel(f"Laya checkpoint {checkpoint!r} is not configured")
            return checkpoint, script
        lang = (call.controls.lang or "").split("-")[0].lower()
        chosen = (
            self._named(call.model)
            or self._named(call.controls.task)
            or (self._named("english" if lang == "en" else "multilingual") if lang else None)
            or (self._named("multilingual") if needs_multilingual else None)
            or self.default
        )
        return chosen, script

    def plan(self, call: EngineCall, *, checkpoint: str | None = None) -> Plan:
        """Validate the questions and assemble every row; raises ``ValidationFailed``."""
        name, script = self.choose(call, checkpoint)
        ckpt = self.checkpoints[name]
        questions = prepare(call.questions)
        max_len = call.controls.max_len or ckpt.cfg.max_len
        head_max_len = call.controls.head_max_len or ckpt.cfg.head_max_len
        rows, state_tokens = (
            build_rows(ckpt.tok, call.state, questions, max_len=max_len, head_max_len=head_max_len)
            if questions
            else ([], 0)
        )
        readable = ckpt.multilingual or script in LATIN_ONLY_SCRIPTS
        return Plan(
            checkpoint=name,
            script=script,
            readable=readable,
            questions=questions,
            rows=rows,
            state_tokens=state_tokens,
        )

    def preview(self, call: EngineCall, *, checkpoint: str | None = None) -> CallPreview:
        plan = self.plan(call, checkpoint=checkpoint)
        rows = {
            q.qid: RowPreview(
                n_options=len(r.markers),
                row_tokens=len(r.ids),
                state_tokens=plan.state_tokens,
                state_tokens_dropped=plan.state_tokens - r.state_used,
                collapsed=r.collapsed,
            )
            for q, r in zip(plan.questions, plan.rows, strict=True)
        }
        return CallPreview(
            checkpoint=plan.checkpoint, script=plan.script, readable=plan.readable, rows=rows
        )
