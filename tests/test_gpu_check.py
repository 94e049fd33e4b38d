"""benchmarks/gpu_check.sh as far as a machine without a GPU allows: staging chunks across commands and
refusing a missing or damaged one (the GPU run itself: README, ort-cuda)."""
import hashlib
import io
import os
import tarfile
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")


def _run(tmp_path, *args, chunks: dict[str, bytes]):
    """Runs the script from a copy of the repository's benchmarks folder whose .gpu/ holds `chunks`."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    (repo / "benchmarks" / "gpu_check.sh").write_bytes(open(SCRIPT, "rb").read())
    gpu = repo / ".gpu"
    if gpu.exists():
        for old in gpu.iterdir():
            old.unlink()
    gpu.mkdir(exist_ok=True)
    for name, data in chunks.items():
        (gpu / name).write_bytes(data)
    env = {**os.environ, "STAGE": str(tmp_path / "stage"), "SITE": str(tmp_path / "site")}
    return subprocess.run(["bash", str(repo / "benchmarks" / "gpu_check.sh"), *args], capture_output=True,
                          text=True, env=env, timeout=60)


WHEEL = b"PK not really a wheel, only bytes to reassemble " * 1000
SUMS = f"{hashlib.sha256(WHEEL).hexdigest()}  ./pkg-1.0-py3-none-any.whl\n".encode()


def _stream() -> bytes:
    """The wheels as benchmarks/gpu_wheels.sh streams them: one uncompressed tar, cut into chunks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("./pkg-1.0-py3-none-any.whl")
        info.size = len(WHEEL)
        tar.addfile(info, io.BytesIO(WHEEL))
    return buffer.getvalue()


def test_chunks_staged_across_commands_are_reassembled_and_checked(tmp_path):
    stream = _stream()
    half = len(stream) // 2
    first = _run(tmp_path, "stage", chunks={"SHA256SUMS": SUMS, "PARTS": b"2\n", "wheels.tar.part-00": stream[:half]})
    assert first.returncode == 0, first.stderr
    # The second command carries only the last chunk; the stage kept the first.
    second = _run(tmp_path, chunks={"wheels.tar.part-01": stream[half:]})
    assert "pkg-1.0-py3-none-any.whl: OK" in second.stdout  # sha256sum's verdict on the reassembled wheel
    assert (tmp_path / "stage" / "pkg-1.0-py3-none-any.whl").read_bytes() == WHEEL


@pytest.mark.parametrize("chunks, message", [
    ({}, "no .gpu/SHA256SUMS and .gpu/PARTS carried"),
    ({"SHA256SUMS": SUMS, "PARTS": b"2\n", "wheels.tar.part-00": _stream()[:100]}, "a chunk is missing or damaged"),
    ({"SHA256SUMS": SUMS, "PARTS": b"1\n", "wheels.tar.part-00": _stream()[:-3000]}, "a chunk is missing or damaged"),
], ids=["no manifest", "missing chunk", "damaged chunk"])
def test_a_missing_manifest_or_chunk_stops_before_installing(tmp_path, chunks, message):
    result = _run(tmp_path, chunks=chunks)
    assert result.returncode == 2
    assert message in result.stdout
    assert not (tmp_path / "site").exists()
