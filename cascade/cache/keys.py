"""Cache keys: sha256 of everything that determines a tier's answer, and nothing else.

A key hashes the namespace (the tenant, or one shared namespace), the tier's name and content
id (its weights' hash; an upstream's URLs and model), the policy and calibration hashes of the
request's own policy version, the confidence profile, and the normalised call: the validated
state (as decoded, key order kept: it is the text a tier reads), each image's sha256 and type,
the request ``model`` and the controls. A tier that answers each question alone gets one key per
question (the question id included: a question without instructions reads its id); a joint tier
one key for the whole set of questions it was sent, ids and order included. The request id and
budget are not part of a key: they never change an answer.
"""

from __future__ import annotations

import hashlib

import msgspec

from cascade.calls import EngineCall


class Version(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy version contributes to every key."""

    policy: str  # cascade.policy.fingerprint.policy_hash
    calibration: str  # cascade.policy.fingerprint.calibration_hash
    tiers: dict[str, str]  # tier name -> content id ("" when none is known: fakes in tests)


_encoder = msgspec.json.Encoder()


def call_prefix(
    version: Version, *, namespace: str, tier: str, profile: str, call: EngineCall
) -> hashlib._Hash:
    """A running hash of every key part of ``call`` but its questions."""
    images = [(hashlib.sha256(image.data).hexdigest(), image.mime) for image in call.images]
    head = [
        1,
        namespace,
        tier,
        version.tiers.get(tier, ""),
        version.policy,
        version.calibration,
        profile,
        call.model,
        images,
        call.controls,
    ]
    digest = hashlib.sha256(_encoder.encode(head))
    digest.update(b"\0")
    digest.update(_encoder.encode(call.state))
    return digest


def question_keys(prefix: hashlib._Hash, call: EngineCall) -> dict[str, str]:
    """One key per question of ``call`` (for tiers that answer each question alone)."""
    keys = {}
    for qid, question in call.questions.items():
        digest = prefix.copy()
        digest.update(b"\0q")
        digest.update(_encoder.encode([qid, question]))
        keys[qid] = digest.hexdigest()
    return keys


def joint_key(prefix: hashlib._Hash, call: EngineCall) -> str:
    """The key of the whole question set of ``call`` (for joint tiers)."""
    digest = prefix.copy()
    digest.update(b"\0j")
    digest.update(_encoder.encode(list(call.questions.items())))
    return digest.hexdigest()
