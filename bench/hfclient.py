"""The real Hugging Face client as a job runs it, in a process of its own:

    python -m bench.hfclient '{"repo": "acme/m", "names": ["a.bin"], "type": "model"}'

`hf_hub_download` of each of `names`, or `snapshot_download` of the whole repository
without them, or with `"fs": true` what `datasets` reads a Hub dataset's Parquet files
with (`HfFileSystem`: its listing, then a Parquet reader's ranged reads, the footer
first, then the rest), with whatever the environment says (`HF_ENDPOINT`, `HF_HOME`,
`HTTPS_PROXY`, `SSL_CERT_FILE`, `HF_HUB_DISABLE_XET`); its last line of output is a
JSON object of each file's SHA-256 by its path in the repository. With `"load": true`,
`datasets.load_dataset` of the repository's `train` split, and the SHA-256 of its rows
(`rows_digest`) by the name `train`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def parquet_reads(repo: str, repo_type: str) -> dict[str, str]:
    """Each Parquet file of the repository read as a Parquet reader reads it."""
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem()
    base = f"{repo_type}s/{repo}"
    digests = {}
    for path in sorted(fs.glob(f"{base}/**/*.parquet")):
        with fs.open(path, "rb", block_size=64 * 1024) as f:
            f.seek(-8, 2)
            f.read(8)
            f.seek(0)
            digests[path[len(base) + 1 :]] = hashlib.sha256(f.read()).hexdigest()
    return digests


def rows_digest(columns: dict[str, list[object]]) -> str:
    """The SHA-256 of a table's rows, column by column (a dataset's, or the Parquet
    files' it was made from), whatever metadata either carries."""
    return hashlib.sha256(repr(sorted(columns.items())).encode()).hexdigest()


def load_train_split(repo: str) -> dict[str, str]:
    import datasets

    table = datasets.load_dataset(repo, split="train").data.table
    return {"train": rows_digest(table.to_pydict())}


def main(ask: dict[str, object]) -> dict[str, str]:
    # Imported here: the module is named by tools that never run a download.
    from huggingface_hub import hf_hub_download, snapshot_download

    repo, repo_type = str(ask["repo"]), str(ask.get("type") or "model")
    names = ask.get("names")
    if ask.get("fs"):
        return parquet_reads(repo, repo_type)
    if ask.get("load"):
        return load_train_split(repo)
    if isinstance(names, list):
        paths = {
            name: Path(hf_hub_download(repo, name, repo_type=repo_type)) for name in names
        }
    else:
        root = Path(snapshot_download(repo, repo_type=repo_type))
        paths = {
            str(path.relative_to(root)): path
            for path in sorted(root.rglob("*"))
            if path.is_file() and ".cache" not in path.relative_to(root).parts
        }
    return {name: sha256(path) for name, path in paths.items()}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
