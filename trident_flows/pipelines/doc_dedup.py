"""The near-duplicate index shared by every replica of the dedup operator.

Contract:
- The rule, a function of the set of documents that reach dedup and not of their order: a
  document is a near-duplicate of the smallest id (string order) among the documents with a
  *smaller* id whose verified estimated Jaccard similarity to it is >= the threshold (candidates
  from MinHash LSH, which is symmetric and deterministic); without one it is kept. So the kept
  document of a cluster is its smallest id, and which replica or batch saw a document first
  does not matter.
- ``LshIndex.check_and_insert(items)`` takes ``(id, minhash values)`` pairs and, for each in
  order, atomically inserts the document (duplicates too) and answers by the rule over the
  documents seen so far: "" (kept) or the id it duplicates. A document's answer can only change
  when a smaller-id match arrives later; the index then revises it (kept -> duplicate, or to a
  smaller original) and ``revisions()`` returns every revised ``{id: final answer}``. A streaming
  run cannot take back a row it has written, so the pipeline applies the revisions to its
  committed output once the run ends (``documents.finish_run``). Answers are remembered: a
  retried batch gets each id's current answer.
- ``LshIndex.seed(items)`` takes ``(id, minhash values, answer the committed output holds)``
  triples of documents an earlier, interrupted run committed, so a resumed run decides as an
  uninterrupted one: they are inserted like any document, and each keeps the smaller of its
  committed original and the rule's answer over the index (the committed original was a match
  in the earlier run, and it reaches dedup again since it is in the same input). A seeded
  document revised later (a smaller-id match arrives) is in ``revisions()`` like any other;
  ``documents.resume_run`` seeds the index from a run's committed shards. With
  ``trust_committed=False`` (documents curated by earlier runs of a corpus, whose originals need not
  reach dedup again) a seeded document's answer is the rule's alone; ``revisions()`` still compares
  it with the answer its row holds.
- ``signatures()`` returns every document in the index, in id order, with its MinHash values and
  current answer: the index a later run of the same corpus is seeded with
  (``corpus.near_dup_store``).
- What can still differ between two runs over the same documents: nothing in the output once
  ``finish_run`` has run, a resumed run included (its index seeded from the committed shards). Before it (while a run is going, or when a run dies before its end) a
  document whose smaller-id near-duplicate has not arrived yet is in the output as kept; it was
  embedded for nothing, and if embedding it failed it sits in the dead-letter table rather than
  being marked a duplicate (the one way the dead letters can differ). The rule is pairwise: in a
  chain a ~ b ~ c with a !~ c, c is a duplicate of b although b is itself a duplicate of a.
- ``shared_index(name, threshold, num_perm)`` returns a handle on the index called ``name``:
  a named, detached Ray actor (``num_cpus=0``) when Ray is initialised, so replicas in any
  process of the cluster share it; otherwise an in-process registry entry (unit tests, one
  process). ``release_index(name)`` removes it when a run is finished.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol, Sequence

import numpy as np

ACTOR_PREFIX = "trident-dedup-"
MINHASH_SCHEME = "affine32"  # datasketch permutation scheme of every signature in an index


class LshIndex:
    """MinHash LSH (datasketch) with verified matches and remembered answers."""

    def __init__(self, threshold: float, num_perm: int) -> None:
        from datasketch import MinHashLSH

        if not 0.0 < threshold < 1.0:
            raise ValueError(f"dedup threshold must lie in (0, 1), got {threshold}")
        self.threshold = threshold
        self.num_perm = num_perm
        # Candidates come from a looser LSH band layout (better recall); each is verified
        # against the threshold on the stored signatures.
        self._lsh = MinHashLSH(threshold=max(0.05, threshold - 0.2), num_perm=num_perm)
        self._hashes: dict[str, np.ndarray] = {}
        self._answers: dict[str, str] = {}
        self._given: dict[str, str] = {}  # the answer each document's output row holds
        self._lock = threading.Lock()

    def check_and_insert(self, items: Sequence[tuple[str, np.ndarray]]) -> list[str]:
        with self._lock:
            return [self._insert(key, values, committed=None) for key, values in items]

    def seed(self, items: Sequence[tuple[str, np.ndarray, str]], trust_committed: bool = True) -> int:
        """Insert documents an earlier run committed, with the answer their output holds ("" = kept);
        returns how many were new to the index."""
        with self._lock:
            new = [(key, values, committed) for key, values, committed in sorted(items, key=lambda item: item[0])
                   if key not in self._answers]
            for key, values, committed in new:
                self._insert(key, values, committed=committed, trust=trust_committed)
            return len(new)

    def signatures(self) -> tuple[list[str], np.ndarray, list[str]]:
        """Ids in order, their MinHash values (one row each) and current answers."""
        with self._lock:
            ids = sorted(self._hashes)
            values = np.stack([self._hashes[k] for k in ids]) if ids else np.zeros((0, self.num_perm), dtype=np.uint64)
            return ids, values, [self._answers[k] for k in ids]

    def _insert(self, key: str, values: np.ndarray, committed: str | None, trust: bool = True) -> str:
        """The answer for ``key``, inserting it first when new (``committed``: the answer of a seeded
        document's committed row, which bounds its answer when ``trust``; None for a document being
        decided now)."""
        from datasketch import MinHash

        values = np.asarray(values, dtype=np.uint64)
        if len(values) != self.num_perm:
            raise ValueError(f"dedup index expects {self.num_perm} minhash values, got {len(values)} for {key!r}")
        if key not in self._answers:
            signature = MinHash(num_perm=self.num_perm, hashvalues=values, scheme=MINHASH_SCHEME)
            matches = sorted(c for c in self._lsh.query(signature) if float(np.mean(self._hashes[c] == values)) >= self.threshold)
            answer = next((c for c in matches if c < key), "")
            if trust and committed and (not answer or committed < answer):
                answer = committed
            self._answers[key] = answer
            self._given[key] = answer if committed is None else committed
            for later in (c for c in matches if c > key):  # arrived before this smaller id: revise
                if not self._answers[later] or key < self._answers[later]:
                    self._answers[later] = key
            self._hashes[key] = values
            self._lsh.insert(key, signature)
        return self._answers[key]

    def revisions(self) -> dict[str, str]:
        """``{id: final answer}`` of every document whose answer differs from the one its output row holds."""
        with self._lock:
            return {key: self._answers[key] for key in sorted(self._answers) if self._answers[key] != self._given[key]}

    def size(self) -> int:
        return len(self._hashes)


class IndexHandle(Protocol):
    def check_and_insert(self, items: Sequence[tuple[str, np.ndarray]]) -> list[str]: ...

    def seed(self, items: Sequence[tuple[str, np.ndarray, str]], trust_committed: bool = True) -> int: ...

    def revisions(self) -> dict[str, str]: ...

    def signatures(self) -> tuple[list[str], np.ndarray, list[str]]: ...


class _ActorHandle:
    def __init__(self, actor) -> None:
        self._actor = actor

    def check_and_insert(self, items: Sequence[tuple[str, np.ndarray]]) -> list[str]:
        import ray

        return ray.get(self._actor.check_and_insert.remote(list(items)))

    def seed(self, items: Sequence[tuple[str, np.ndarray, str]], trust_committed: bool = True) -> int:
        import ray

        return ray.get(self._actor.seed.remote(list(items), trust_committed))

    def revisions(self) -> dict[str, str]:
        import ray

        return ray.get(self._actor.revisions.remote())

    def signatures(self) -> tuple[list[str], np.ndarray, list[str]]:
        import ray

        return ray.get(self._actor.signatures.remote())


_LOCAL: dict[str, LshIndex] = {}
_LOCAL_LOCK = threading.Lock()


def _ray_ready() -> bool:
    """Whether this process is connected to Ray (without importing Ray when nothing has)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def shared_index(name: str, threshold: float, num_perm: int) -> IndexHandle:
    """The index called ``name`` (created on first use; see the module docstring)."""
    if _ray_ready():
        import ray

        actor_cls = ray.remote(num_cpus=0, max_concurrency=1)(LshIndex)
        actor = actor_cls.options(name=ACTOR_PREFIX + name, get_if_exists=True, lifetime="detached").remote(threshold, num_perm)
        return _ActorHandle(actor)
    with _LOCAL_LOCK:
        index = _LOCAL.setdefault(name, LshIndex(threshold, num_perm))
    if (index.threshold, index.num_perm) != (threshold, num_perm):
        raise ValueError(f"dedup index {name!r} exists with threshold={index.threshold}, num_perm={index.num_perm}; "
                         f"asked for threshold={threshold}, num_perm={num_perm}")
    return index


def release_index(name: str) -> None:
    """Remove the index called ``name`` (its Ray actor, or the in-process entry)."""
    with _LOCAL_LOCK:
        _LOCAL.pop(name, None)
    if _ray_ready():
        import ray

        try:
            ray.kill(ray.get_actor(ACTOR_PREFIX + name))
        except ValueError:
            pass
