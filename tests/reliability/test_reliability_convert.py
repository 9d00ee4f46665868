"""Faults while converting the default model's HF folder: killed mid-write, disk full, unreadable shards.

The converter writes `.OUT.gguf.<host>.<pid>.<random>.tmp` next to the output and
moves it into place at the end (ggml_ext/gguf/writer.py, ggml_ext/_atomic.py).
What each fault must leave:

* SIGKILL mid-write: no output; the temp file stays (nothing can run after
  SIGKILL), named for the killed process.  The next write to the same output
  removes it (its owner is dead), succeeds and leaves no temp file; a temp
  file of a live process (a concurrent conversion) or of another host is left
  alone.  With `--force` over an existing output, the old output is untouched.
* SIGINT / SIGTERM / SIGHUP mid-write: the temp file is removed, "interrupted;
  nothing was written", exit 128+signal.
* a write that fails (the file-size limit RLIMIT_FSIZE of 20 MiB: EFBIG): `error: OUT:
  File too large`, exit 1, no output, no temp file.  Runs unprivileged, everywhere.
* disk full (a 20 MiB tmpfs in a user + mount namespace, `unshare -Urm`): `error: OUT:
  No space left on device`, the same; skipped where unprivileged namespaces are off.
* a shard that is a directory, a FIFO, empty, truncated or a dangling symlink:
  `error: ...`, exit 1, no output, no hang.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggml_ext import _atomic
from ggml_ext.gguf import read_gguf

import convert_support as cs

N_TENSORS = 272       # SmolLM2-135M: 30 layers x 9 + token_embd + output_norm
KILL_AFTER = 8 << 20  # bytes in the temp file before the signal: well inside the data section


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    from ggml_ext import assets
    p = Path(assets.path("smollm2-hf"))
    if not (p / "model.safetensors").is_file():
        pytest.skip(f"default model's HF folder not fetched ({p})")
    return p


def convert_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ggml_ext.cli", "convert", str(src), "-o", str(out), "--type", "q8_0", "-q",
            "-t", "1", *extra]


def temps(folder: Path, out_name: str) -> list[Path]:
    return sorted(folder.glob(f".{out_name}.*.tmp"))


def start_and_signal(cmd: list[str], folder: Path, out_name: str, sig: int, before: set[Path] = frozenset()):
    """Start a conversion, wait until its temp file holds KILL_AFTER bytes, send `sig`; returns (rc, stderr, tmp)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=cs.default_sigint)
    deadline = time.monotonic() + 60
    tmp = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            new = [t for t in temps(folder, out_name) if t not in before]
            if new:
                try:
                    if new[0].stat().st_size >= KILL_AFTER:
                        tmp = new[0]
                        break
                except FileNotFoundError:
                    pass
            time.sleep(0.005)
        assert tmp is not None, f"no temp file grew past {KILL_AFTER} bytes (rc {proc.poll()})"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, tmp


def test_sigkill_mid_write_then_rerun(hf_dir, tmp_path):
    out = tmp_path / "out.gguf"
    rc, _, tmp = start_and_signal(convert_cmd(hf_dir, out), tmp_path, out.name, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert not out.exists(), "a killed conversion left an output file"
    assert temps(tmp_path, out.name) == [tmp]           # the leftover, named for its dead owner
    assert {p.name for p in tmp_path.iterdir()} == {tmp.name}
    # a concurrent writer's temp (this live process) must survive the clean-up
    live = tmp_path / f".{out.name}.{_atomic._HOST}.{os.getpid()}.abcdefgh.tmp"
    live.write_bytes(b"in progress")

    r = subprocess.run(convert_cmd(hf_dir, out), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    g = read_gguf(out)
    assert len(g.tensors) == N_TENSORS and g.file_size == out.stat().st_size
    # the rerun removed the dead run's temp, left the live one and none of its own
    assert temps(tmp_path, out.name) == [live]
    live.unlink()

    # --force over a good output, killed mid-write: the old output is untouched; the next
    # --force run removes that temp too
    before = (out.stat().st_size, out.stat().st_mtime_ns, out.read_bytes()[:4096])
    rc, _, tmp2 = start_and_signal(convert_cmd(hf_dir, out, "--force"), tmp_path, out.name, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert (out.stat().st_size, out.stat().st_mtime_ns, out.read_bytes()[:4096]) == before
    assert len(read_gguf(out).tensors) == N_TENSORS
    assert temps(tmp_path, out.name) == [tmp2]
    r = subprocess.run(convert_cmd(hf_dir, out, "--force"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert temps(tmp_path, out.name) == []
    assert len(read_gguf(out).tensors) == N_TENSORS


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_clean_up_removes_only_dead_owners_of_this_host(tmp_path):
    """_atomic.remove_stale_temps: a dead pid of this host goes; live pids, other hosts,
    other targets and names it did not make stay."""
    target = tmp_path / "m.gguf"
    host = _atomic._HOST
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f".m.gguf.{host}.{_dead_pid()}.x1y2z3q4.tmp"
        keep = [tmp_path / f".m.gguf.{host}.{sleeper.pid}.aaaaaaaa.tmp",       # live process
                tmp_path / f".m.gguf.{host}.1.bbbbbbbb.tmp",                    # pid 1 (init): alive
                tmp_path / f".m.gguf.other-host.{_dead_pid()}.cccccccc.tmp",    # another host's
                tmp_path / f".n.gguf.{host}.{_dead_pid()}.dddddddd.tmp",        # another target's
                tmp_path / ".m.gguf.k2j3h4g5.tmp",                              # old-style name: unknown owner
                tmp_path / f".m.gguf.{host}.notapid.eeeeeeee.tmp"]
        for p in [dead, *keep]:
            p.write_bytes(b"x")
        assert _atomic.remove_stale_temps(target) == [dead]
        assert sorted(tmp_path.iterdir()) == sorted(keep)
        # the writers call it: a write to the target sweeps the next dead temp as well
        dead2 = tmp_path / f".m.gguf.{host}.{_dead_pid()}.ffffffff.tmp"
        dead2.write_bytes(b"x")
        _atomic.write_bytes(target, b"data")
        assert target.read_bytes() == b"data"
        assert sorted(tmp_path.iterdir()) == sorted(keep + [target])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_temp_name_says_host_and_pid(tmp_path):
    fd, tmp = _atomic.temp_file(tmp_path / "out.gguf")
    os.close(fd)
    prefix = f".out.gguf.{_atomic._HOST}.{os.getpid()}."
    assert tmp.name.startswith(prefix) and tmp.name.endswith(".tmp") and "." not in tmp.name[len(prefix):-4]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_interrupt_removes_the_temp_file(hf_dir, tmp_path, sig):
    out = tmp_path / "out.gguf"
    rc, err, _ = start_and_signal(convert_cmd(hf_dir, out), tmp_path, out.name, sig)
    assert rc == 128 + sig, err
    assert "interrupted; nothing was written" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


FSIZE_LIMIT = 20 << 20   # far below the default model's q8_0 output (about 145 MB)


def _limit_file_size():
    """In the converter child: files may not grow past FSIZE_LIMIT, and the write that would
    gets EFBIG instead of the default SIGXFSZ (which kills the process)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_write_error_file_too_large(hf_dir, tmp_path):
    """A write that fails mid-data (any OSError, here EFBIG): one clear line naming the output,
    exit 1, nothing left.  The same path as a full disk, without needing a small file system."""
    out = tmp_path / "out.gguf"
    r = subprocess.run(convert_cmd(hf_dir, out), capture_output=True, text=True, timeout=300,
                       preexec_fn=_limit_file_size)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == f"error: {out}: File too large", r.stderr
    assert list(tmp_path.iterdir()) == [], "output or temp file left after the failed write"


# Run inside a new user + mount namespace: mount a 20 MiB tmpfs on $1, run the rest of the
# arguments (the converter) with its stderr in $2, then write what is left on the tmpfs to $3.
_IN_NAMESPACE = """
mount -t tmpfs -o size=20m tmpfs "$1" || exit 97
mnt=$1 err=$2 left=$3
shift 3
"$@" >/dev/null 2>"$err"
rc=$?
"$0" -c 'import json, os, shutil, sys; print(json.dumps([os.listdir(sys.argv[1]), shutil.disk_usage(sys.argv[1]).used]))' \
    "$mnt" >"$left"
exit $rc
"""


@pytest.fixture(scope="module")
def user_mount_ns(tmp_path_factory):
    """Skip unless this user may mount a tmpfs in a new user + mount namespace (no root needed)."""
    d = tmp_path_factory.mktemp("ns-probe")
    try:
        r = subprocess.run(["unshare", "-Urm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                           capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("`unshare` (util-linux) is not installed: no tmpfs to fill without root "
                    "(test_write_error_file_too_large covers the write error)")
    if r.returncode != 0:
        pytest.skip("this machine refuses unprivileged user + mount namespaces (`unshare -Urm mount -t tmpfs` "
                    f"failed: {r.stderr.strip()}); test_write_error_file_too_large covers the write error")


def test_disk_full(hf_dir, tmp_path, user_mount_ns):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    out = mnt / "out.gguf"
    err, left = tmp_path / "stderr", tmp_path / "left.json"
    r = subprocess.run(["unshare", "-Urm", "sh", "-c", _IN_NAMESPACE, sys.executable, str(mnt), str(err), str(left),
                        *convert_cmd(hf_dir, out)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 97, f"could not mount the tmpfs: {r.stderr}"
    assert r.returncode == 1, (r.returncode, r.stderr, err.read_text())
    assert err.read_text().strip() == f"error: {out}: No space left on device", err.read_text()
    files, used = json.loads(left.read_text())
    assert files == [], "output or temp file left on the full file system"
    assert used < 1 << 20


SHARD = "model-00001-of-00001.safetensors"


def _safetensors_names(path: Path) -> list[str]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return [k for k in header if k != "__metadata__"]


@pytest.fixture(scope="module")
def sharded_template(hf_dir, tmp_path_factory) -> Path:
    """The HF folder as a one-shard index (config and tokenizer as symlinks, no weights yet)."""
    d = tmp_path_factory.mktemp("sharded")
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            (d / f.name).symlink_to(f)
    names = _safetensors_names(hf_dir / "model.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {n: SHARD for n in names}}))
    return d


def _make_bad_shard(kind: str, shard: Path, real: Path) -> None:
    if kind == "directory":
        shard.mkdir()
    elif kind == "fifo":
        os.mkfifo(shard)
    elif kind == "empty":
        shard.write_bytes(b"")
    elif kind == "header only":
        with open(real, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            f.seek(0)
            shard.write_bytes(f.read(8 + n))
    elif kind == "truncated mid-data":
        with open(real, "rb") as f:
            shard.write_bytes(f.read(10 << 20))
    elif kind == "dangling symlink":
        shard.symlink_to(shard.parent / "gone.safetensors")
    elif kind == "garbage":
        shard.write_bytes(struct.pack("<Q", 2**62) + b"{" * 64)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["directory", "fifo", "empty", "header only", "truncated mid-data",
                                  "dangling symlink", "garbage"])
def test_unreadable_shard(hf_dir, sharded_template, tmp_path, kind):
    src = tmp_path / "hf"
    shutil.copytree(sharded_template, src, symlinks=True)
    _make_bad_shard(kind, src / SHARD, hf_dir / "model.safetensors")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "out.gguf"
    r = subprocess.run(convert_cmd(src, out), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (kind, r.returncode, r.stderr)
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert SHARD in r.stderr, r.stderr          # the message names the shard at fault
    assert list(outdir.iterdir()) == []


def test_sharded_template_is_convertible(hf_dir, sharded_template, tmp_path):
    """The shard tests fail because of the shard, not the index: with the real file as shard it converts."""
    src = tmp_path / "hf"
    shutil.copytree(sharded_template, src, symlinks=True)
    (src / SHARD).symlink_to(hf_dir / "model.safetensors")
    out = tmp_path / "ok.gguf"
    r = subprocess.run(convert_cmd(src, out, "--vocab-only"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.is_file()
