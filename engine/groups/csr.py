"""Acoustic Similarity Groups as CSR, host side (`SpeechGroups`) and device side (`GroupIndex`).

Groups `G_k` are rows of a CSR over speech-local token ids. Without deduplication there is one
group per token, `G(t)`, and `home[t] = t`; with deduplication identical groups are stored once
and `home[t]` names the group equal to `G(t)`. The device index also holds the transpose,
`S(t)` = the groups containing `t`, and uses `N(t) = |S(t)|` for the equal-split weights, so the
coarse distributions stay exact even when a size cap made groups asymmetric
(docs/pcg.md sections 2-3). For symmetric, undeduplicated groups `S(t) = G(t)`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SpeechGroups:
    """Groups over speech-local ids `0..num_tokens-1`.

    Members of group `k` are `members[indptr[k]:indptr[k+1]]`, sorted. `home[t]` is the group
    defined by token `t` (None: group `t`, i.e. no deduplication).
    """

    indptr: np.ndarray  # [M + 1] int64
    members: np.ndarray  # [nnz] uint16 where ids fit, else int32
    theta: float
    num_tokens: int
    home: np.ndarray | None = None  # [num_tokens] int64
    max_group_size: int | None = None
    truncated: int = 0  # groups cut at max_group_size
    meta: dict = field(default_factory=dict)
    full_sizes: np.ndarray | None = None  # [num_tokens] int32 |G(t)| before the cap (capped builds)

    @property
    def num_groups(self) -> int:
        return len(self.indptr) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def code_ranges(self) -> list[tuple[int, int]]:
        """`(first id, size)` of the code ranges the groups were built within (`meta["ranges"]`;
        groups made without it: one range)."""
        return [(int(start), int(size)) for start, size in self.meta.get("ranges", [[0, self.num_tokens]])]

    def mixes_ranges(self, ranges: list[tuple[int, int]]) -> bool:
        """Whether some group holds ids of two of the code `ranges` (`(first id, size)` pairs): such
        groups would let PCG stand one frame position's code in for another's."""
        return mixes_ranges(self.indptr, self.members, ranges)

    def group(self, k: int) -> np.ndarray:
        return self.members[self.indptr[k]:self.indptr[k + 1]]

    def group_of(self, token: int) -> np.ndarray:
        """G(token): the group the token defines."""
        return self.group(token if self.home is None else int(self.home[token]))

    @classmethod
    def from_lists(cls, groups: list, theta: float, **kw) -> SpeechGroups:
        """Undeduplicated groups from `groups[t]` = members of G(t)."""
        sizes = np.array([len(g) for g in groups], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate([np.sort(np.asarray(g, dtype=np.int64)) for g in groups])
        dtype = np.uint16 if len(groups) <= 65536 else np.int32
        return cls(indptr=indptr, members=flat.astype(dtype), theta=theta,
                   num_tokens=len(groups), **kw)

    @classmethod
    def singletons(cls, num_tokens: int) -> SpeechGroups:
        return cls.from_lists([[t] for t in range(num_tokens)], theta=1.0)


def mixes_ranges(indptr: np.ndarray, members: np.ndarray, ranges: list[tuple[int, int]]) -> bool:
    """Whether a group of the CSR (members sorted within each group) holds ids of two `ranges`:
    its first and last member lie in its lowest and highest range."""
    starts = np.array([start for start, _ in ranges], dtype=np.int64)
    in_range = np.searchsorted(starts, members.astype(np.int64), side="right")  # [nnz] 1 + range of each member
    return bool(len(members)) and bool((in_range[indptr[:-1]] != in_range[indptr[1:] - 1]).any())


def _transpose(indptr: torch.Tensor, members: torch.Tensor, num_tokens: int):
    """CSR of groups-over-tokens -> CSR of tokens-over-groups (S(t), sorted)."""
    num_groups = len(indptr) - 1
    group_of_entry = torch.repeat_interleave(torch.arange(num_groups), indptr.diff())
    order = torch.argsort(members * num_groups + group_of_entry)
    counts = torch.bincount(members, minlength=num_tokens)
    contain_indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    return contain_indptr, group_of_entry[order]


class GroupIndex:
    """Device-side groups over the output space: speech groups plus one singleton group for each
    non-speech output id (the end-of-speech token is never stood in for).

    Attributes:
        indptr, members: CSR of groups `G_k` over output ids.
        contain_indptr, contain: CSR of `S(t)`, the groups containing output id `t`.
        home: `[V_out]` group defined by each output id.
        n_contain: `[V_out]` N(t) = |S(t)|; `inv_n` its float32 inverse (the equal split).
        max_size: largest group (host int; pads the vectorised gathers).
    """

    def __init__(self, groups: SpeechGroups, vocab_out: int, device: torch.device | str = "cpu"):
        n_speech = groups.num_tokens
        if n_speech > vocab_out:
            raise ValueError(f"groups cover {n_speech} tokens but the output space has {vocab_out}")
        m = groups.num_groups
        extra = torch.arange(n_speech, vocab_out, dtype=torch.long)
        indptr = torch.from_numpy(groups.indptr.astype(np.int64))
        indptr = torch.cat([indptr, indptr[-1] + 1 + torch.arange(len(extra))])
        members = torch.cat([torch.from_numpy(groups.members.astype(np.int64)), extra])
        home = torch.arange(n_speech) if groups.home is None else torch.from_numpy(
            groups.home.astype(np.int64))
        home = torch.cat([home, m + torch.arange(len(extra))])
        contain_indptr, contain = _transpose(indptr, members, vocab_out)
        self.symmetric = bool(
            torch.equal(home, torch.arange(vocab_out))
            and torch.equal(contain_indptr, indptr)
            and torch.equal(contain, members)
        )
        put = lambda t: t.to(device)  # noqa: E731
        self.indptr, self.members, self.home = put(indptr), put(members), put(home)
        self.size = put(indptr.diff())
        self.contain_indptr, self.contain = put(contain_indptr), put(contain)
        self.n_contain = put(contain_indptr.diff())
        if int(self.n_contain.min()) < 1:
            raise ValueError("some token lies in no group; every token must be in its own group")
        self.inv_n = (1.0 / self.n_contain.float()).to(device)
        self._membership: dict[torch.dtype, torch.Tensor] = {}  # `membership`, per dtype
        self._member_group: torch.Tensor | None = None  # each member entry's group (`all_masses` off CPUs)
        self.max_size = int(self.size.max())
        self.num_groups = len(indptr) - 1
        self.vocab_out = vocab_out
        self.theta = groups.theta

    def padded_members(self, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Members of each group, padded: `group_ids` `[...]` -> (`[..., max_size]` ids,
        `[..., max_size]` valid mask). Padding repeats a valid id and is masked out."""
        offsets = torch.arange(self.max_size, device=group_ids.device)
        start = self.indptr[group_ids]
        valid = offsets < self.size[group_ids][..., None]
        idx = torch.where(valid, start[..., None] + offsets, start[..., None])
        return self.members[idx], valid

    def pick_label(self, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Group label K ~ w[., token]: uniform over S(token) (the equal split)."""
        n = self.n_contain[tokens]
        offset = (u * n.double()).long().clamp_(max=n - 1)
        return self.contain[self.contain_indptr[tokens] + offset]

    def weighted(self, probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """`probs[..., ids] / N(ids)`: the members' probabilities gathered, then weighted by the
        equal split (the same products as weighting the whole vocabulary, without a pass over it)."""
        return probs.gather(-1, ids) * self.inv_n[ids]

    def mass(self, probs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Coarse mass `R_c(G_k) = sum_{t in G_k} r(t) / N(t)` for each requested group:
        `probs` `[..., V]`, `group_ids` `[..., n]` -> `[..., n]`. A gather-sum, O(|G_k|)."""
        ids, valid = self.padded_members(group_ids)  # [..., n, m]
        n, m = ids.shape[-2], ids.shape[-1]
        flat = self.weighted(probs, ids.reshape(*ids.shape[:-2], n * m))
        return (flat.reshape(ids.shape) * valid).sum(-1)

    def all_masses(self, probs: torch.Tensor) -> torch.Tensor:
        """Coarse masses of every group: `probs` `[b, V]` -> `[b, M]`, each group's members added
        in their order. On a CPU one product with the weighted membership matrix (`membership`);
        on other devices `gathered_masses` (the path tested on CUDA; the sparse product's gain is
        known on CPUs only)."""
        if probs.device.type == "cpu":
            return (self.membership(probs.dtype) @ probs.T).T.contiguous()
        return self.gathered_masses(probs)

    def gathered_masses(self, probs: torch.Tensor) -> torch.Tensor:
        """`all_masses` by gathering every member's weighted probability `[b, nnz]` and adding it
        into its group (`index_add_`)."""
        if self._member_group is None:
            self._member_group = torch.repeat_interleave(torch.arange(self.num_groups, device=self.size.device),
                                                         self.size)
        vals = (probs * self.inv_n)[:, self.members]  # [b, nnz]
        out = torch.zeros(probs.shape[0], self.num_groups, dtype=probs.dtype, device=probs.device)
        return out.index_add_(1, self._member_group, vals)

    def membership(self, dtype: torch.dtype) -> torch.Tensor:
        """`[M, V]` sparse CSR matrix, `w[k, t] = 1 / N(t)` for `t` in `G_k` (made once per dtype):
        its product with probabilities gives the coarse masses, in less time than gathering every
        member and adding it into its group."""
        matrix = self._membership.get(dtype)
        if matrix is None:
            # 32-bit indices where they fit: the sparse product would convert 64-bit ones every call
            index = torch.int32 if len(self.members) < 2**31 else torch.int64
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch marks sparse CSR support beta
                matrix = torch.sparse_csr_tensor(self.indptr.to(index), self.members.to(index),
                                                 self.inv_n[self.members].to(dtype),
                                                 size=(self.num_groups, self.vocab_out))
            self._membership[dtype] = matrix
        return matrix

    def contains(self, group_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Whether `tokens[...]` lies in `G_{group_ids[...]}`."""
        ids, valid = self.padded_members(group_ids)
        return ((ids == tokens[..., None]) & valid).any(-1)
