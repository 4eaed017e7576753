#!/usr/bin/env python3
"""Refresh the committed copy of upstream ztensor's conformance corpus
(tag py-v2.1.2, MIT, tests/data/ztensor-corpus/LICENSE).

The 76 files (about 1 MB) are committed under
tests/data/ztensor-corpus/py-v2.1.2 so the tests run them on machines that
cannot reach GitHub. This script made that copy: it downloads the tag's
source archive from GitHub (or takes the files from a local clone with
--from-git, or an extracted tree with --from-dir), keeps only
conformance/corpus/{valid,reject}/*.zt, checks every file against
tests/data/ztensor-corpus/py-v2.1.2.tsv (names and SHA-256; nothing more and
nothing less), and puts them in DEST (default: the committed copy, where
zt/tests/zt_conformance.rs and tests/test_zt.py look; both also honour
ZT_ZTENSOR_CORPUS). Nothing is built or run. Exits non-zero when the corpus
cannot be had or does not match.

    python3 scripts/fetch-ztensor-corpus.py
    python3 scripts/fetch-ztensor-corpus.py --from-git ~/src/ztensor/.git
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

TAG = "py-v2.1.2"
URL = f"https://codeload.github.com/pie-project/ztensor/tar.gz/refs/tags/{TAG}"
PREFIX = "conformance/corpus/"
ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "data" / "ztensor-corpus" / f"{TAG}.tsv"


def manifest() -> dict[str, str]:
    """file -> sha256, from the committed manifest."""
    out = {}
    for line in MANIFEST.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sha = line.split("\t")[:2]
            out[name] = sha
    return out


def from_tar(data: bytes) -> dict[str, bytes]:
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar.getmembers():
            # GitHub archives put everything under "<repo>-<tag>/".
            _, _, path = member.name.partition("/")
            if member.isfile() and path.startswith(PREFIX) and path.endswith(".zt"):
                f = tar.extractfile(member)
                if f is not None:
                    files[path[len(PREFIX) :]] = f.read()
    return files


def from_git(gitdir: str) -> dict[str, bytes]:
    data = subprocess.run(
        ["git", f"--git-dir={gitdir}", "archive", "--format=tar", f"--prefix=ztensor-{TAG}/", TAG, PREFIX],
        check=True,
        capture_output=True,
    ).stdout
    return from_tar(data)


def from_dir(top: str) -> dict[str, bytes]:
    base = Path(top)
    if (base / PREFIX).is_dir():
        base = base / PREFIX
    return {str(p.relative_to(base)): p.read_bytes() for p in base.glob("*/*.zt")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dest", default=os.environ.get("ZT_ZTENSOR_CORPUS") or ROOT / "tests" / "data" / "ztensor-corpus" / TAG
    )
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--from-git", metavar="GITDIR", help="a clone's git directory that has the tag")
    source.add_argument("--from-dir", metavar="DIR", help="an extracted source tree, or its corpus directory")
    args = ap.parse_args()
    dest = Path(args.dest)
    want = manifest()
    present = dest.is_dir() and {str(p.relative_to(dest)) for p in dest.glob("*/*.zt")} == set(want)
    if present and all(hashlib.sha256((dest / n).read_bytes()).hexdigest() == s for n, s in want.items()):
        print(f"upstream corpus already at {dest}")
        return 0
    try:
        if args.from_git:
            files = from_git(args.from_git)
        elif args.from_dir:
            files = from_dir(args.from_dir)
        else:
            with urllib.request.urlopen(URL, timeout=60) as r:
                files = from_tar(r.read())
    except Exception as e:  # noqa: BLE001 - reported, and the exit code says it failed
        print(f"cannot fetch upstream ztensor's corpus ({TAG}): {e}", file=sys.stderr)
        return 1
    missing = sorted(set(want) - set(files))
    extra = sorted(set(files) - set(want))
    wrong = sorted(n for n in set(want) & set(files) if hashlib.sha256(files[n]).hexdigest() != want[n])
    if missing or extra or wrong:
        print(
            f"the corpus does not match {MANIFEST.name}: missing {missing}, extra {extra}, changed {wrong}",
            file=sys.stderr,
        )
        return 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".corpus-", dir=dest.parent))
    for name, data in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)
    print(f"upstream corpus ({len(files)} files, {TAG}) at {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
