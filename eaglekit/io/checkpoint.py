"""Find a checkpoint's files (local dir or Hub cache) and read every tensor's header entry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from eaglekit.config_view import REPO_ID
from eaglekit.errors import CheckpointError, UsageError, quoted
from eaglekit.io.header import HeaderEntry, read_header
from eaglekit.io.jsonfile import check_inside, load_json_object, symlink_root, within

INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
MAX_DRAFT_TENSORS = 2048  # published drafts hold tens to a few hundred; every rule walks every tensor


@dataclass
class CheckpointFiles:
    """A draft directory as read from disk: its config and every tensor's location."""

    root: str
    config: dict
    config_path: str
    weight_files: list[str]  # relative to root
    entries: dict[str, tuple[str, HeaderEntry]]  # tensor name -> (relative file, entry)
    metadata: dict[str, str] = field(default_factory=dict)
    index: dict | None = None
    pickle_tensors: dict[str, object] | None = None  # name -> torch tensor, only with allow_pickle
    extra_files: list[str] = field(default_factory=list)


def resolve_path(source: str, subfolder: str | None = None,
                 revision: str | None = None) -> tuple[str, str | None]:
    """Return (checkpoint dir, the dir symlinks may resolve into: None for a folder the user named, which may link
    anywhere). Hub ids go through the local cache, whose repositories' links must stay inside them."""
    if os.path.exists(source) or not REPO_ID.match(source):
        root = os.path.abspath(source)
        if not os.path.exists(root):
            raise CheckpointError("no such file or directory", source)
        if revision:
            raise UsageError(f"--revision {quoted(revision)} names a Hub revision, and this is a local folder (read as "
                             "it stands); drop --revision, or give the Hub id", source)
        if os.path.isfile(root):
            if os.path.basename(root) == "config.json":
                root = os.path.dirname(root)
            else:
                raise CheckpointError("expected a checkpoint directory, got a file", source)
        allowed = symlink_root(root)
    else:
        root, allowed = _from_hub(source, revision)
    if subfolder:
        inner = os.path.normpath(os.path.join(root, subfolder))
        if os.path.isabs(subfolder) or not within(inner, os.path.normpath(root)):
            raise UsageError(f"--subfolder {quoted(subfolder)} leaves the repository: give a folder inside it", source)
        root = inner
        if not os.path.isdir(root):
            raise CheckpointError(f"subfolder {quoted(subfolder)} does not exist", source)
    return root, allowed


def _from_hub(repo_id: str, revision: str | None) -> tuple[str, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from eaglekit.io.hub_client import bounded_hub_client
    from eaglekit.io.urls import without_credentials

    bounded_hub_client()

    patterns = ["*.json", "*.safetensors", "**/*.json", "**/*.safetensors", "*.md"]
    try:
        path = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        try:
            path = snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
        except LocalEntryNotFoundError:
            raise CheckpointError("not in the local Hugging Face cache and the Hub is unreachable (offline?)",
                                  repo_id) from None
        except (HfHubHTTPError, OSError, ValueError) as exc:
            reason = without_credentials(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise CheckpointError(f"cannot download from the Hub: {reason}", repo_id) from None
    # snapshot files are symlinks into the repo cache's blobs/: that whole repo folder is trusted
    return path, os.path.dirname(os.path.dirname(path))


def candidate_subfolders(root: str) -> list[str]:
    """Child folders that look like drafts of their own (config.json + weights), e.g. P48 repos."""
    found = []
    for name in sorted(os.listdir(root)):
        sub = os.path.join(root, name)
        if os.path.isdir(sub) and os.path.isfile(os.path.join(sub, "config.json")):
            if any(f.endswith((".safetensors",) + PICKLE_SUFFIXES) for f in os.listdir(sub)):
                found.append(name)
    return found


class OversizedCheckpoint(CheckpointError):
    """An index that maps more tensors than a draft holds: a full model. `files` (no header entries) and `names`
    (from the index) still let a target that carries its own draft heads (MTP) be recognised."""

    def __init__(self, message: str, path: str, files: CheckpointFiles, names: list[str]):
        self.files, self.names = files, names
        super().__init__(message, path)


def read_checkpoint(
    source: str,
    *,
    subfolder: str | None = None,
    revision: str | None = None,
    allow_pickle: bool = False,
) -> CheckpointFiles:
    """A checkpoint folder (or Hub id) as files, config and tensor headers, no tensor bytes: links that leave the
    folder, an index that disagrees with its shards, and pickles without `allow_pickle` are refused."""
    root, allowed = resolve_path(source, subfolder, revision)
    if not os.path.isdir(root):
        raise CheckpointError("not a directory", root)
    config_path = os.path.join(root, "config.json")
    if not os.path.exists(config_path):
        subs = candidate_subfolders(root)
        if subs:
            raise UsageError(f"no config.json here; drafts found in subfolders {quoted(subs)}: pick one with "
                             "--subfolder", root)
        raise CheckpointError("no config.json in the checkpoint directory", root)
    check_inside(config_path, allowed, config_path)
    config = load_json_object(config_path, "config.json")

    names = sorted(os.listdir(root))
    for name in names:
        full = os.path.join(root, name)
        if os.path.islink(full):
            check_inside(full, allowed, full)

    index = None
    if INDEX_NAME in names:
        index, weight_files = _read_index(CheckpointFiles(root, config, config_path, [], {}))
    else:
        weight_files = [n for n in names if n.endswith(".safetensors") and not n.startswith("adapter_")]

    extra = [n for n in names if n.startswith("adapter_") or n == "hf_quant_config.json"]
    if not weight_files:
        pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
        if pickles and not allow_pickle:
            raise CheckpointError(
                f"weights are pickle files ({', '.join(pickles)}); refusing to unpickle: pass --allow-pickle "
                "to load them with torch.load(weights_only=True)",
                root,
            )
        if pickles:
            return _read_pickles(root, config, config_path, pickles, extra)
        raise CheckpointError("no safetensors weights found", root)

    entries, metadata = _read_headers(root, weight_files)
    if index is not None:
        _check_index_matches(root, index["weight_map"], entries)
    return CheckpointFiles(root, config, config_path, weight_files, entries, metadata, index, None, extra)


def _read_index(found: CheckpointFiles) -> tuple[dict, list[str]]:
    """The shard index and the shards it names, refused when a shard name could leave the folder, a shard is
    missing, or it maps more tensors than a draft holds (the index is read before any shard is opened)."""
    root = found.root
    index_path = os.path.join(root, INDEX_NAME)
    index = load_json_object(index_path, "index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError("index has no weight_map", index_path)
    if len(weight_map) > MAX_DRAFT_TENSORS:
        raise OversizedCheckpoint(f"index maps {len(weight_map):,} tensors, more than the {MAX_DRAFT_TENSORS:,} a "
                                  "draft checkpoint may hold", index_path, found, list(weight_map))
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard.startswith("."):
            raise CheckpointError(f"index maps {quoted(name)} to an invalid shard {quoted(shard)}", index_path)
    weight_files = sorted(set(weight_map.values()))
    for shard in weight_files:
        if not os.path.exists(os.path.join(root, shard)):
            raise CheckpointError(f"index names shard {quoted(shard)}, which does not exist", index_path)
    return index, weight_files


def _read_headers(root: str, weight_files: list[str]) -> tuple[dict[str, tuple[str, HeaderEntry]], dict[str, str]]:
    """Every tensor's (file, header entry) and the files' merged metadata; a tensor in two files, or more tensors
    than a draft holds, is refused (headers only: no tensor bytes are read)."""
    entries: dict[str, tuple[str, HeaderEntry]] = {}
    metadata: dict[str, str] = {}
    for rel in weight_files:
        full = os.path.join(root, rel)
        header = read_header(full, MAX_DRAFT_TENSORS)
        metadata.update(header.metadata)
        for name, entry in header.entries.items():
            if name in entries:
                raise CheckpointError(f"tensor {quoted(name)} appears in both {entries[name][0]} and {rel}", full)
            entries[name] = (rel, entry)
        if len(entries) > MAX_DRAFT_TENSORS:
            raise CheckpointError(f"the weight files list {len(entries):,} tensors, more than the "
                                  f"{MAX_DRAFT_TENSORS:,} a draft checkpoint may hold", root)
    return entries, metadata


def _check_index_matches(root: str, weight_map: dict[str, str], entries: dict[str, tuple[str, HeaderEntry]]) -> None:
    """Refuse an index that disagrees with its shards: engines load by the index, so a tensor it misplaces or
    leaves out would be read wrong or not at all."""
    index_path = os.path.join(root, INDEX_NAME)
    for name, shard in weight_map.items():
        if name not in entries or entries[name][0] != shard:
            raise CheckpointError(f"index maps {quoted(name)} to {quoted(shard)}, but that shard does not hold it",
                                  index_path)
    missing = sorted(set(entries) - set(weight_map))
    if missing:
        shown = ", ".join(quoted(m) for m in missing[:5])
        raise CheckpointError(f"shards hold tensors missing from the index: {shown}", index_path)


def _read_pickles(root: str, config: dict, config_path: str, pickles: list[str], extra: list[str]) -> CheckpointFiles:
    import torch

    from eaglekit.io.dtypes import torch_to_safetensors_dtype

    tensors: dict[str, object] = {}
    entries: dict[str, tuple[str, HeaderEntry]] = {}
    for rel in pickles:
        full = os.path.join(root, rel)
        try:
            state = torch.load(full, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a bad pickle
            raise CheckpointError(f"cannot load with weights_only=True: {str(exc).splitlines()[0]}", full) from None
        if not isinstance(state, dict):
            raise CheckpointError("pickle does not hold a state dict", full)
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            try:
                dtype = torch_to_safetensors_dtype(tensor.dtype)
            except ValueError:
                raise CheckpointError(f"tensor {quoted(name)} has dtype {tensor.dtype}, which no EAGLE-3 engine loads",
                                      full) from None
            entries[name] = (rel, HeaderEntry(name, dtype, tuple(tensor.shape), -1, -1))
            tensors[name] = tensor
        if len(entries) > MAX_DRAFT_TENSORS:
            raise CheckpointError(f"the weight files hold {len(entries):,} tensors, more than the "
                                  f"{MAX_DRAFT_TENSORS:,} a draft checkpoint may hold", root)
    return CheckpointFiles(root, config, config_path, pickles, entries, {}, None, tensors, extra)


def read_model_weights(root: str, allowed: str | None) -> dict[str, tuple[str, HeaderEntry]]:
    """Every tensor's header entry of a model folder of any size (a target's, which may hold tens of thousands):
    the shards its index names (the index cross-checked against them both ways), or every *.safetensors file
    without one. Each header is checked as a draft's is, truncation included; symlinks must stay in `allowed`
    (when not None)."""
    names = sorted(os.listdir(root))
    for name in names:
        if os.path.islink(os.path.join(root, name)):
            check_inside(os.path.join(root, name), allowed, os.path.join(root, name))
    weight_map = None
    if INDEX_NAME in names:
        index_path = os.path.join(root, INDEX_NAME)
        weight_map = load_json_object(index_path, "index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError("index has no weight_map", index_path)
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard.startswith("."):
                raise CheckpointError(f"index maps {name[:100]!r} to an invalid shard {str(shard)[:100]!r}",
                                      index_path)
        files = sorted(set(weight_map.values()))
        for shard in files:
            if not os.path.isfile(os.path.join(root, shard)):
                raise CheckpointError(f"index names shard {shard[:100]!r}, which does not exist", index_path)
    else:
        files = [n for n in names if n.endswith(".safetensors")]
    entries: dict[str, tuple[str, HeaderEntry]] = {}
    for rel in files:
        for name, entry in read_header(os.path.join(root, rel)).entries.items():
            if name in entries:
                raise CheckpointError(f"tensor {name[:100]!r} appears in both {entries[name][0]} and {rel}",
                                      os.path.join(root, rel))
            entries[name] = (rel, entry)
    if weight_map is not None:
        index_path = os.path.join(root, INDEX_NAME)
        for name, shard in weight_map.items():
            if entries.get(name, ("",))[0] != shard:
                raise CheckpointError(f"index maps {name[:100]!r} to {shard[:100]}, but that shard does not hold it",
                                      index_path)
        unlisted = sorted(set(entries) - set(weight_map))
        if unlisted:
            raise CheckpointError(f"shards hold tensors missing from the index: {', '.join(unlisted[:5])[:300]}",
                                  index_path)
    return entries
