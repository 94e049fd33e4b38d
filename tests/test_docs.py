"""Every code block of README.md and docs/*.md runs as written, and every relative link points at a file.

How a page is read (the convention the documents follow):

- A ```python block runs. A page's python blocks run in order, in one fresh interpreter, in an empty temporary
  directory, with this checkout first on the path: later blocks see earlier blocks' names and files.
- A ```console block holds commands, each on a line starting with `$ `, and their output below it. They run
  in a shell in the same directory, at that point of the page, with this checkout's `hlo2onnx` first; every
  command must call `hlo2onnx` (maybe after a pipe), so that nothing shown as runnable is skipped silently.
- A ```text block right after a python block is that block's expected standard output.
- Output is compared loosely, line by line after collapsing whitespace: numbers match within 2% relative
  or 1e-3 absolute (float rounding differs across jax versions), a line `...` matches any number of lines,
  and `...` inside a line matches any text there.
- ```sh and ```bash blocks are instructions for your own shell (installing, make, docker, curl against a
  server): they are not run, and each must carry a skip marker (below) saying why. A ```sh block may not call
  `hlo2onnx`; such examples belong in ```console, which runs.
- ```text blocks elsewhere (a file tree, a config file) and blocks without a language (a function's signature)
  are shown, not run.
- A block that cannot run here (a GPU, a Triton server, a cluster) is preceded by the line
  `<!-- docs-test: skip REASON -->`; this test reports it as skipped with that reason.

Links: every relative link `[..](path)` or `[..](path#anchor)` in README.md, docs/*.md and samples/README.md
must name an existing file, and an anchor in a markdown file must be one of its headings (GitHub's slugs).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
LINKED = PAGES + [ROOT / "samples" / "README.md"]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
TIMEOUT = 600


@dataclass
class Block:
    lang: str
    code: str
    line: int
    skip: str | None = None
    expected: str | None = None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, with skip markers and expected outputs attached."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i, pending_skip = 0, None
    while i < len(lines):
        line = lines[i]
        marker = SKIP.search(line)
        fence = FENCE.match(line)
        if marker:
            pending_skip = marker.group(1)
        elif fence:
            start, lang, body = i + 1, fence.group(1), []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            block = Block(lang, "\n".join(body) + "\n", start, pending_skip)
            pending_skip = None
            if lang == "text" and found and found[-1].lang == "python" and found[-1].expected is None:
                found[-1].expected = block.code
            else:
                found.append(block)
        elif line.strip():
            pending_skip = None
        i += 1
    return found


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b")


def _line_matches(expected: str, actual: str) -> bool:
    expected, actual = " ".join(expected.split()), " ".join(actual.split())
    if "..." in expected:
        pattern = ".*".join(_loose(part) for part in expected.split("..."))
        return re.fullmatch(pattern, actual) is not None and _numbers_close(expected.replace("...", " "), actual,
                                                                            partial=True)
    return re.fullmatch(_loose(expected), actual) is not None and _numbers_close(expected, actual)


def _loose(text: str) -> str:
    """A regex for `text` in which each number matches any number."""
    out, pos = [], 0
    for m in _NUMBER.finditer(text):
        out.append(re.escape(text[pos:m.start()]))
        out.append(r"\s*(?:" + _NUMBER.pattern + ")")
        pos = m.end()
    out.append(re.escape(text[pos:]))
    return "".join(out)


def _numbers_close(expected: str, actual: str, partial: bool = False) -> bool:
    want = [float(x) for x in _NUMBER.findall(expected)]
    got = [float(x) for x in _NUMBER.findall(actual)]
    if partial:
        return True  # with an ellipsis the numbers' positions are not aligned: the regex checked the shape
    if len(want) != len(got):
        return False
    for a, b in zip(got, want):
        if a != a and b != b:
            continue
        if a in (float("inf"), float("-inf")) or b in (float("inf"), float("-inf")):
            if a != b:
                return False
        elif abs(a - b) > 1e-3 + 0.02 * abs(b):
            return False
    return True


def output_matches(expected: str, actual: str) -> bool:
    want = [line for line in expected.strip("\n").splitlines()]
    got = [line for line in actual.strip("\n").splitlines()]

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and _line_matches(want[i], got[j]) and match(i + 1, j + 1)

    return match(0, 0)


_CLI = re.compile(r"(^|\|\s*)(hlo2onnx|python -m hlo2onnx)\b")


def _console(block: Block) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in pairs]


# The program a page runs: its blocks in order, each one's output framed by markers for the comparison.
_RUNNER = r'''
import contextlib, io, os, subprocess, sys, traceback
BLOCKS = {blocks!r}
for index, (kind, code, line) in enumerate(BLOCKS):
    print(f"\n@@block {{index}}@@", flush=True)
    try:
        if kind == "python":
            exec(compile(code, f"{page}:{{line}}", "exec"), globals())
        else:
            result = subprocess.run(code, shell=True, capture_output=True, text=True)
            sys.stdout.write(result.stdout)
            if result.returncode not in (0,):
                sys.stdout.write(result.stderr)
                print(f"@@exit {{result.returncode}}@@")
    except BaseException:
        sys.stdout.flush()
        print(f"@@failed {{index}}@@")
        traceback.print_exc(file=sys.stdout)
        sys.exit(1)
    sys.stdout.flush()
'''


def _runnable(page: Path) -> tuple[list[tuple[str, str, int]], list[tuple[str, int, str | None]]]:
    """The steps a page runs: (kind, code, line), and the expected output of each (None: not compared)."""
    steps, expected = [], []
    for block in blocks(page):
        if block.skip is not None:
            continue
        if block.lang == "python":
            steps.append(("python", block.code, block.line))
            expected.append((block.code, block.line, block.expected))
        elif block.lang == "console":
            for command, out in _console(block):
                steps.append(("shell", command, block.line))
                expected.append((command, block.line, out if out.strip() else None))
    return steps, expected


def test_blocks_follow_the_convention():
    """Every shell block says why it is not run; hlo2onnx examples are console blocks, which run."""
    problems = []
    for page in PAGES:
        for block in blocks(page):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if block.lang in ("sh", "bash", "shell"):
                if block.skip is None:
                    problems.append(f"{where}: a shell block is not run: mark it <!-- docs-test: skip REASON -->")
                if any(_CLI.search(line.strip()) for line in block.code.splitlines()):
                    problems.append(f"{where}: hlo2onnx in a shell block: write it as a console block ($ hlo2onnx)")
            if block.lang == "console" and block.skip is None:
                problems += [f"{where}: {command!r} in a console block does not call hlo2onnx"
                             for command, _ in _console(block) if not _CLI.search(command)]
    assert not problems, "\n".join(problems)


def _pages_with_code() -> list[Path]:
    return [p for p in PAGES if any(b.lang in ("python", "console") and b.skip is None for b in blocks(p))]


@pytest.mark.parametrize("page", _pages_with_code(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_runs(page: Path, tmp_path: Path):
    steps, expected = _runnable(page)
    script = tmp_path / "_page.py"
    script.write_text(_RUNNER.format(blocks=steps, page=page.relative_to(ROOT).as_posix()))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONWARNINGS"] = "ignore"
    result = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT)
    parts = re.split(r"\n@@block (\d+)@@\n", "\n" + result.stdout)
    outputs = {int(parts[k]): parts[k + 1] for k in range(1, len(parts) - 1, 2)}
    for index, (code, line, want) in enumerate(expected):
        out = outputs.get(index)
        where = f"{page.relative_to(ROOT)}:{line}"
        if out is None:
            pytest.fail(f"{where}: not reached\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        failed = re.search(r"@@(failed|exit) \d+@@", out)
        if failed:
            pytest.fail(f"{where}: the block failed:\n{code}\n--- output ---\n{out[-4000:]}\n{result.stderr[-2000:]}")
        if want is not None and not output_matches(want, out):
            pytest.fail(f"{where}: output differs from the page's\n--- page ---\n{want}\n--- got ---\n{out}")
    assert result.returncode == 0, result.stderr[-3000:]


def _skipped() -> list[tuple[Path, Block]]:
    return [(p, b) for p in PAGES for b in blocks(p) if b.skip is not None]


@pytest.mark.parametrize("page, block", _skipped(),
                         ids=[f"{p.relative_to(ROOT).as_posix()}:{b.line}" for p, b in _skipped()])
def test_marked_blocks(page: Path, block: Block):
    pytest.skip(f"{page.relative_to(ROOT)}:{block.line}: {block.skip}")


# -- links ------------------------------------------------------------------------------------------------
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[tuple[int, str]]:
    found, in_code = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if not in_code:
            found += [(number, m.group(1)) for m in _LINK.finditer(line)]
    return found


def test_relative_links_resolve():
    broken = []
    for page in LINKED:
        for number, target in _links(page):
            if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_guide_pages_are_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in _links(ROOT / "README.md")}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_no_history_in_the_docs():
    """The docs describe the current state: git and CHANGELOG.md hold the history."""
    found = []
    for page in LINKED:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"\b(stop|issue) [0-9]+", line, re.I):
                found.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_output_comparison_convention():
    assert output_matches("loss 0.5020\n...\ndone", "loss 0.50201\nx\ny\ndone")
    assert output_matches("error ... on 1 output(s)", "error 1.2e-07 on 1 output(s)")
    assert not output_matches("loss 0.5020", "loss 0.6020")
    assert not output_matches("a\nb", "a")
    assert output_matches("[[0.3825 0.2072]]", "[[0.3826 0.2072]]")


def test_generated_tables_have_their_markers():
    """Each table benchmarks/make_tables.py writes has its block on its page, and only those blocks exist."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import make_tables
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for name, page in make_tables.TABLES.items():
        text = page.read_text()
        assert text.count(f"<!-- table:{name} -->") == 1 and text.count(f"<!-- /table:{name} -->") == 1, name
        assert make_tables.replace_block(text, name, "new").count("new\n<!-- /table:") >= 1
    markers = {m for page in PAGES for m in re.findall(r"^<!-- table:(\w+) -->$", page.read_text(), re.M)}
    assert markers == set(make_tables.TABLES)
