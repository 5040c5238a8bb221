"""The groups file: one self-describing safetensors file (bytes in, bytes out; `cache.py` and the
CLI decide where the bytes live).

Tensors (speech-local ids, docs/pcg.md section 2):
    indptr          [M + 1] int64   CSR offsets of the groups
    members         [nnz]   uint16  (int32 beyond 65,536 tokens), sorted within each group
    n_contain       [V]     int32   N(t): how many groups contain token t
    full_sizes      [V]     int32   |G(t)| before the cap            (capped builds only)
    home            [V]     int32   the group equal to G(t)          (deduplicated only)
    contain_indptr  [V + 1] int64   reverse CSR: groups containing t (deduplicated only)
    contain         [nnz]   int32
Metadata (`__metadata__["pcg_synth_groups"]`, JSON): format, format_version, theta,
max_group_size, truncated, metric, dedup, source, embeddings_sha256, embeddings_shape, backend,
family (the target's model family, or null when the rows came without one), ranges (the code
ranges `[start, size]` the groups were built within: no group mixes two), stats, and
content_sha256 (a hash of every tensor and the metadata, checked on load; safetensors has no
checksum of its own).

`family` and `ranges` came without a version bump: a file written before them lacks both and
reads as family null, one range over every token, which is how it was built, so it still serves
a one-range (Llasa) target; readers that predate them ignore them.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from engine.groups.csr import SpeechGroups, mixes_ranges
from engine.groups.options import check_ranges
from engine.groups.stats import group_stats
from engine.io.storage import write_atomic

FORMAT = "pcg-synth/speech-groups"
FORMAT_VERSION = 1
META_KEY = "pcg_synth_groups"
PROVENANCE = ("source", "embeddings_sha256", "embeddings_shape", "backend")
LAYOUT = ("family", "ranges")  # checked first by `from_bytes`: the message a wrong target gets


class GroupFileError(ValueError):
    """A groups file is unreadable, corrupt, of another format version, or built for other inputs."""


def content_sha256(tensors: dict[str, np.ndarray], meta: dict) -> str:
    """Hash of every tensor and of the metadata (less this hash): a flipped bit anywhere shows."""
    body = {k: v for k, v in meta.items() if k != "content_sha256"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode())
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def reverse_csr(indptr: np.ndarray, members: np.ndarray, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Groups-over-tokens CSR -> tokens-over-groups CSR: S(t), the groups containing t, sorted."""
    group_of_entry = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    order = np.argsort(members, kind="stable")  # stable: groups stay ascending within a token
    counts = np.bincount(members.astype(np.int64), minlength=num_tokens)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), group_of_entry[order]


def deduplicate(groups: SpeechGroups) -> SpeechGroups:
    """Store identical groups once; `home[t]` names the group equal to G(t) (first-seen order)."""
    if groups.home is not None:
        return groups
    seen: dict[bytes, int] = {}
    home = np.empty(groups.num_tokens, dtype=np.int64)
    first = []
    for t in range(groups.num_groups):
        k = seen.setdefault(groups.group(t).tobytes(), len(seen))
        if k == len(first):
            first.append(t)
        home[t] = k
    sizes = groups.sizes[first]
    members = np.concatenate([groups.group(t) for t in first])
    return SpeechGroups(indptr=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                        members=members, theta=groups.theta, num_tokens=groups.num_tokens, home=home,
                        max_group_size=groups.max_group_size, truncated=groups.truncated,
                        meta=dict(groups.meta), full_sizes=groups.full_sizes)


def to_tensors(groups: SpeechGroups) -> dict[str, np.ndarray]:
    counts = np.bincount(groups.members.astype(np.int64), minlength=groups.num_tokens)
    tensors = {"indptr": groups.indptr.astype(np.int64), "members": groups.members,
               "n_contain": counts.astype(np.int32)}
    if groups.full_sizes is not None:
        tensors["full_sizes"] = groups.full_sizes.astype(np.int32)
    if groups.home is not None:
        contain_indptr, contain = reverse_csr(groups.indptr, groups.members, groups.num_tokens)
        tensors.update(home=groups.home.astype(np.int32), contain_indptr=contain_indptr,
                       contain=contain.astype(np.int32))
    return tensors


def to_bytes(groups: SpeechGroups) -> bytes:
    """Serialise; `groups.meta` must carry the provenance (see `cache.build_with_metadata`).

    Raises:
        ValueError: the provenance (embeddings hash, source, ...) is missing.
    """
    missing = [k for k in PROVENANCE if k not in groups.meta]
    if missing:
        raise ValueError(f"groups lack provenance {missing}: build them with "
                         "engine.groups.cache.build_with_metadata or get_groups")
    tensors = to_tensors(groups)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "theta": groups.theta,
            "max_group_size": groups.max_group_size, "truncated": groups.truncated,
            "metric": "cosine", "dedup": groups.home is not None,
            "num_tokens": groups.num_tokens,
            **{k: groups.meta[k] for k in PROVENANCE},
            "family": groups.meta.get("family"),
            "ranges": [[start, size] for start, size in groups.code_ranges],
            "symmetrised_pairs": groups.meta.get("symmetrised_pairs", 0),
            "stats": group_stats(groups)}
    meta["content_sha256"] = content_sha256(tensors, meta)
    return st_save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True)})


def read_meta(data: bytes, name: str) -> dict:
    """The metadata block, checked for format and version before any tensor is read."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n]) if 8 + n <= len(data) else None
        meta = json.loads(header["__metadata__"][META_KEY])
    except (struct.error, ValueError, TypeError, KeyError) as exc:
        raise GroupFileError(f"{name}: not a pcg-synth groups file, or corrupt (cannot read its "
                             f"header: {type(exc).__name__})") from None
    if meta.get("format") != FORMAT:
        raise GroupFileError(f"{name}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise GroupFileError(f"{name}: groups format version {meta.get('format_version')}, this "
                             f"pcg-synth reads version {FORMAT_VERSION}; rebuild it with "
                             "`pcg-synth groups build`")
    return meta


def check_structure(t: dict[str, np.ndarray], meta: dict, name: str) -> None:
    """Cheap invariants a decoder relies on (a hash can match a file written wrongly)."""
    indptr, members, n = t["indptr"], t["members"].astype(np.int64), meta["num_tokens"]
    problems = []
    if indptr[0] != 0 or indptr[-1] != len(members) or (np.diff(indptr) < 1).any():
        problems.append("indptr is not a CSR of non-empty groups")
    elif len(members) and (members.min() < 0 or members.max() >= n):
        problems.append(f"member ids outside 0..{n - 1}")
    elif not np.array_equal(t["n_contain"], np.bincount(members, minlength=n)):
        problems.append("n_contain disagrees with the members")
    elif "home" not in t and len(indptr) != n + 1:
        problems.append(f"{len(indptr) - 1} groups for {n} tokens without a home index")
    elif "home" in t:
        home = t["home"].astype(np.int64)
        reverse = reverse_csr(indptr, members, n)
        if len(home) != n or home.min() < 0 or home.max() >= len(indptr) - 1:
            problems.append("home index out of range")
        elif not (np.array_equal(reverse[0], t["contain_indptr"])
                  and np.array_equal(reverse[1], t["contain"])):
            problems.append("reverse index disagrees with the members")
    if not problems:
        problems = range_problems(indptr, members, file_ranges(meta), n)
    if problems:
        raise GroupFileError(f"{name}: corrupt groups file ({problems[0]})")


def range_problems(indptr: np.ndarray, members: np.ndarray, ranges: list, num_tokens: int) -> list[str]:
    """The code ranges must tile the tokens and no group may mix two."""
    try:
        bounds = check_ranges(ranges, num_tokens)
    except (ValueError, TypeError):
        return [f"code ranges {ranges} do not tile 0..{num_tokens - 1}"]
    return ["a group mixes code ranges"] if mixes_ranges(indptr, members, bounds) else []


def file_ranges(meta: dict) -> list[list[int]]:
    """The file's code ranges; a file written before ranges were recorded has one."""
    return meta.get("ranges") or [[0, meta.get("num_tokens", 0)]]


def describe_ranges(ranges: list) -> str:
    """`1 range of 65,536 codes`, `7 ranges of 4,096 codes`, `2 ranges of 10, 20 codes`."""
    try:
        sizes = [int(size) for _, size in ranges]
    except (TypeError, ValueError):
        return f"code ranges {ranges!r}"  # a malformed file; its structure check names it corrupt
    counts = f"{sizes[0]:,}" if len(set(sizes)) == 1 else ", ".join(f"{n:,}" for n in sizes)
    return f"{len(sizes)} range{'s' if len(sizes) != 1 else ''} of {counts} codes"


def check_layout(meta: dict, expect: dict, name: str) -> None:
    """The file's family and code ranges against `expect`'s, where it gives them. A file without a
    family (built from bare rows, or before families were recorded) passes on its ranges alone."""
    have_family, have_ranges = meta.get("family"), file_ranges(meta)
    want_family, want_ranges = expect.get("family"), expect.get("ranges")
    want_ranges = None if want_ranges is None else [[int(start), int(size)] for start, size in want_ranges]
    if (have_family is None or want_family is None or have_family == want_family) \
            and (want_ranges is None or have_ranges == want_ranges):
        return
    if have_family is None:
        have = "a target of unknown family"
    else:
        have = f"{'an' if have_family[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {have_family} target"
    want = want_family or "this target"
    if want_ranges is not None:
        want += f" ({describe_ranges(want_ranges)})"
    raise GroupFileError(f"{name}: built for {have} ({describe_ranges(have_ranges)}), not {want}: build "
                         "groups for this target (`pcg-synth groups build --target`)")


def check_expected(meta: dict, expect: dict | None, name: str) -> None:
    expect = expect or {}
    check_layout(meta, expect, name)
    for key, want in expect.items():
        if key in LAYOUT:
            continue
        if meta.get(key) != want:
            raise GroupFileError(f"{name}: built for {key}={meta.get(key)!r}, but {want!r} was "
                                 "asked for (a file for other embeddings or settings)")


def from_bytes(data: bytes, name: str = "<bytes>", expect: dict | None = None) -> SpeechGroups:
    """Parse and verify a groups file.

    Args:
        data: the file's bytes.
        name: what to call it in errors (a path or URI).
        expect: metadata that must match, e.g. `{"embeddings_sha256": ..., "theta": 0.4}`;
            `family` and `ranges` (`[(start, size), ...]`) are checked before the rest, so a file
            for another family's target says so (a file without a family passes on its ranges).

    Raises:
        GroupFileError: unreadable, corrupt, another format version, or `expect` mismatched.
    """
    meta = read_meta(data, name)
    check_expected(meta, expect, name)
    try:
        t = st_load(data)
    except Exception as exc:  # safetensors raises its own error types for every kind of damage
        raise GroupFileError(f"{name}: corrupt groups file ({exc})") from None
    if content_sha256(t, meta) != meta.get("content_sha256"):
        raise GroupFileError(f"{name}: corrupt groups file (content hash mismatch)")
    check_structure(t, meta, name)
    home = t["home"].astype(np.int64) if "home" in t else None
    info = {k: v for k, v in meta.items() if k != "content_sha256"}
    info.update(family=meta.get("family"), ranges=file_ranges(meta))
    return SpeechGroups(indptr=t["indptr"], members=t["members"], theta=meta["theta"],
                        num_tokens=meta["num_tokens"], home=home,
                        max_group_size=meta["max_group_size"], truncated=meta["truncated"],
                        meta=info, full_sizes=t.get("full_sizes"))


def save_groups(groups: SpeechGroups, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, to_bytes(groups))
    return path


def load_groups(path: str | Path, expect: dict | None = None) -> SpeechGroups:
    """Read a groups file; see `from_bytes` for `expect` and errors."""
    path = Path(path)
    if not path.is_file():
        raise GroupFileError(f"groups file {path} does not exist")
    return from_bytes(path.read_bytes(), str(path), expect)
