"""The near-duplicate index shared by every replica of the dedup operator.

Contract:
- The rule, a function of the set of documents that reach dedup and not of their order: a document
  is a near-duplicate of the smallest id (string order) among the documents with a smaller id whose
  verified estimated Jaccard similarity to it is >= the threshold (MinHash LSH candidates); without
  one it is kept. The kept document of a cluster is its smallest id, whatever replica saw it first.
- ``LshIndex.check_and_insert(items)``: per ``(id, minhash values)`` "" (kept) or the id it
  duplicates; answers are remembered (a retried batch gets each id's current answer) and revised
  when a smaller-id match arrives later (``revisions()``: ``{id: final answer}``).
- ``LshIndex.seed(items)``: documents an interrupted or earlier run committed, so a resumed run
  decides as an uninterrupted one; ``signatures()``: the whole index, in id order, for the next run
  of a corpus (``corpus.near_dup_store``).
- ``shared_index(name, threshold, num_perm)``: a named, detached Ray actor when Ray is initialised,
  otherwise an in-process registry entry; ``release_index(name)`` removes it.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol, Sequence

import numpy as np

ACTOR_PREFIX = "trident-dedup-"
MINHASH_SCHEME = "affine32"  # datasketch permutation scheme of every signature in an index


class LshIndex:
    """MinHash LSH (datasketch) with verified matches and remembered answers.

    ``check_and_insert`` inserts each document (duplicates too) atomically and answers by the rule over the
    documents seen so far. A document's answer can only change when a smaller-id match arrives later; the
    index then revises it (kept -> duplicate, or to a smaller original). A streaming run cannot take back a
    row it has written, so the pipeline applies ``revisions()`` to its committed output once the run ends
    (``documents.finish_run``); after that nothing in the output differs between two runs over the same
    documents, a resumed one included. Before it, a document whose smaller-id near-duplicate has not arrived
    yet is in the output as kept (embedded for nothing; if embedding it failed it sits in the dead-letter
    table rather than being marked a duplicate: the one way the dead letters can differ). The rule is
    pairwise: in a chain a ~ b ~ c with a !~ c, c is a duplicate of b although b is one of a."""

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
        returns how many were new to the index.

        So a resumed run decides as an uninterrupted one, each keeps the smaller of its committed original
        and the rule's answer over the index (the committed original was a match in the earlier run, and it
        reaches dedup again since it is in the same input); a seeded document revised later is in
        ``revisions()`` like any other. With ``trust_committed=False`` (documents of earlier runs of a corpus,
        whose originals need not reach dedup again) its answer is the rule's alone; ``revisions()`` still
        compares it with the answer its row holds."""
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
