"""The H200 scripts under benchmarks/ run on a lent machine whose every second counts: they
must parse, and a limit that ends a script must end what it is running, or the next device
call measures beside it (twenty-first session: a serving step ran on into the next call)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


@needs_bash
@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.sh")))
def test_the_script_parses(script):
    res = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _pending_steps() -> list[str]:
    """The steps gpu_pending.sh dispatches on (the labels of its `case "$what" in`)."""
    import re

    text = (BENCHMARKS / "gpu_pending.sh").read_text()
    body = text[text.index('case "$what" in'):]
    return [m.group(1) for m in re.finditer(r"^([a-z0-9-]+)\)", body, re.M)]


@needs_bash
def test_gpu_pending_help_and_usage_name_every_step_it_runs(tmp_path):
    """A device call is planned from `--help`: every step the script dispatches is named in
    it and in the usage line; an unknown step gets the usage and exit 2, before any work."""
    script = str(BENCHMARKS / "gpu_pending.sh")
    steps = _pending_steps()
    assert "r50-small" in steps and "first" in steps and len(steps) > 20
    helped = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and not helped.stderr
    usage = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30)
    assert usage.returncode != 0 and "--help" in usage.stderr
    named = usage.stderr.split("usage: ", 1)[1].split()[1].split("|")
    for step in steps:
        assert f"gpu_pending.sh {step} OUT_DIR" in helped.stdout, step
    assert sorted(named) == sorted(steps)
    out = tmp_path / "out"
    wrong = subprocess.run(["bash", script, "no-such-step", str(out)], capture_output=True,
                           text=True, timeout=30, env={**os.environ, "PENDING_DIR": str(tmp_path / "b")})
    assert wrong.returncode == 2 and "usage:" in wrong.stderr
    assert not out.exists() and not (tmp_path / "b").exists()


def _alive(pid: int) -> bool:
    """Running (a zombie left for a parent that does not reap it is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_bash
def test_a_limit_that_ends_gpu_pending_ends_its_running_step(tmp_path):
    """gpu_pending.sh's `step` under an outer `timeout`, as a device call runs it: the
    step's command (in the process group of the step's own `timeout`) must go too."""
    text = (BENCHMARKS / "gpu_pending.sh").read_text()
    header = text[:text.index('case "$what" in')]       # the script's set-up and `step`
    pid_file = tmp_path / "child.pid"
    child = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
             "print('child up', flush=True); time.sleep(120)")
    script = tmp_path / "one_step.sh"
    script.write_text(header + f"step sleeper 300 {sys.executable} -c \"{child}\"\n"
                      "echo after-the-step\n")
    out = tmp_path / "out"
    proc = subprocess.Popen(["timeout", "60", "bash", str(script), "dw", str(out)],   # a known step
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env={**os.environ,
                                               "PENDING_DIR": str(tmp_path / "pending")})
    log = out / "sleeper.log"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text() and log.exists()
               and log.read_text() == "child up\n"):     # running, and its output logged
        assert time.monotonic() < deadline, "the step's command never started"
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    try:
        os.kill(proc.pid, signal.SIGTERM)     # what `timeout` sends at the limit (its group)
        output, _ = proc.communicate(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the step's command outlived the script"
        assert "after-the-step" not in output and "child up" in output
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


@needs_bash
@pytest.mark.parametrize("shim, said", [
    ('__version__ = "1.30.0"\n', "onnxruntime 1.30.0 is installed"),   # the image's own
    (None, "missing zstandard"),
])
def test_gpu_pending_stops_before_any_step_without_the_packages_it_needs(tmp_path, shim, said):
    """The device image has onnxruntime 1.30, which `bundle make` refuses, and lacks the
    bundler's zstandard: a call that did not carry the wheels (forty-sixth session: its
    ViT builds failed minutes in) stops at once with exit 3, naming the wheels script,
    before it makes a folder or starts a step. Stand-in packages first on the path of the
    script's python3 say what that machine has."""
    site = tmp_path / "site"
    name, body = ("zstandard", "raise ImportError('not on this machine')\n") if shim is None \
        else ("onnxruntime", shim)
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(body)
    pending = tmp_path / "pending"
    done = subprocess.run(
        ["timeout", "60", "bash", str(BENCHMARKS / "gpu_pending.sh"), "pdl", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site), "PENDING_DIR": str(pending)})
    assert done.returncode == 3, done.stdout + done.stderr
    assert said in done.stderr and "device_wheels.sh" in done.stderr, done.stderr
    assert not pending.exists() and "==" not in done.stdout      # no step started


@needs_bash
def test_make_parallel_reuses_what_an_earlier_call_built(tmp_path):
    """Every build of make_parallel passes --reuse (a re-run after an interrupted call, or
    bundles copied in, are kept instead of compiled again: twenty-first session, a call
    lost ~230 s rebuilding copied bundles) and appends to its log; a failed build fails it."""
    fake = tmp_path / "fake-bundle"
    fake.write_text('#!/bin/sh\necho "args: $*"\ncase "$*" in *fail*) exit 3;; esac\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    common = BENCHMARKS / "gpu_common.sh"

    def make_parallel(*items: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", f'. "{common}"; make_parallel "$@"', "sh", str(out), *items],
            capture_output=True, text=True, env={**os.environ, "BUNDLE": str(fake)})

    for _ in range(2):
        done = make_parallel("fp16:--precision fp16", "fp8:--precision fp8")
        assert done.returncode == 0, done.stdout + done.stderr
    lines = (out / "make-timm_xception-fp8.log").read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("args: make timm_xception --reuse ")
                                   and line.endswith("--out " + str(out) + " --precision fp8")
                                   for line in lines), lines
    failed = make_parallel("bad:--precision fail")
    assert failed.returncode != 0 and "a build failed" in failed.stdout


def _run_step(tmp_path: Path, card: str, what: str = "first",
              built: bool | list[str] = True, extra_env: dict[str, str] | None = None
              ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """gpu_pending.sh step WHAT in a copy of benchmarks/, with `nvidia-smi` naming CARD and
    the bundle command and python3 replaced by loggers: which commands it starts. BUILT:
    whether the step should have built the two uint8 bundles (their make logs), or the
    names the bundle folder should hold."""
    bench = tmp_path / "repo" / "benchmarks"
    bench.mkdir(parents=True)
    for name in ("gpu_pending.sh", "gpu_common.sh"):
        shutil.copy(BENCHMARKS / name, bench / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for name, body in (("nvidia-smi", f'echo "{card}"'),
                       ("python3", f'echo "python3 $*" >> "{calls}"'),
                       ("fake-bundle",
                        f'echo "bundle $* families=$TRT_BUNDLE_FAMILIES_PATH" >> "{calls}"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "BUNDLE": str(bin_dir / "fake-bundle"), "PENDING_DIR": str(tmp_path / "pending"),
           "PREFLIGHT": "0"}     # its python3 is the logger (the preflight's own test above)
    for name in ("WORKERS", "PROCS", "REPEATS", "GRAPH_SIZES", "GAPS_FAMILIES", "CUDNN_FAMILIES",
                 "CUDNN_FAMILY", "CUDNN_PRECISIONS", "STUDY_FAMILIES"):
        env.pop(name, None)
    env.update(extra_env or {})
    done = subprocess.run(["timeout", "60", "bash", str(bench / "gpu_pending.sh"), what,
                           str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    expected = built if isinstance(built, list) else [
        "make-timm_xception-fp16-uint8.log", "make-timm_xception-fp8-uint8.log"] if built else []
    assert sorted(p.name for p in (tmp_path / "pending").iterdir()) == expected
    return done, calls.read_text().splitlines() if calls.exists() else []


def _family_copy_builds(calls: list[str], copy: Path, family: str, setting: str) -> list[str]:
    """A step's build from a family copy: one `python3 -c` edit of SETTING in
    COPY/families/FAMILY/family.json; returns the builds that read COPY/families."""
    edits = [c for c in calls if c.startswith("python3 -c") and setting in c
             and c.endswith(f"{copy}/families/{family}/family.json")]
    assert len(edits) == 1, calls
    return [c for c in calls if c.startswith("bundle make") and f"families={copy}/families" in c]


def _check_split_k(root: Path, calls: list[str], count: int) -> None:
    """`vit-split-k`'s calls: COUNT builds (the split form from an edited family copy), the
    split bundle verified, COUNT bundles timed at batches 1 and 2."""
    pending = root / "pending"
    builds = [c for c in calls if c.startswith("bundle make")]
    assert len(builds) == count, builds
    assert (f"{pending}/vit-split --precision fp8 families={pending}/vit-split/families"
            in [c.split(" --out ")[1] for c in builds]), builds
    assert len(_family_copy_builds(calls, pending / "vit-split", "timm_vit_base",
                                   "triton-split-k")) == 1, calls
    verified = [c for c in calls if "verify --numerics" in c]
    assert len(verified) == 1 and "/vit-split/timm_vit_base-fp8-" in verified[0], calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "--batch-sizes 1,2" in timed[0], calls
    assert len([w for w in timed[0].split() if w.endswith(".bundle")]) == count, timed


@needs_bash
def test_first_runs_the_gpu_tests_but_the_whole_bundle_ones_on_any_card(tmp_path):
    """The one call a scarce machine may allow, on any card: every GPU test but the two
    that build whole bundles (the kernels' launches moved onto kernels.launch.traceable;
    the split-K ViT form it followed was timed in the forty-seventh session). `gputest`
    alone still runs those two after the rest."""
    for card in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        root = tmp_path / card.split()[1]
        done, calls = _run_step(root, card, built=[])
        assert done.returncode == 0, done.stdout + done.stderr
        tests = [c for c in calls if "-m pytest" in c]
        assert len(tests) == 1 and "-m gpu tests -k not bundle_matches" in tests[0], calls
        assert "== gputest: exit 0" in done.stdout
        assert "gputest-bundles" not in done.stdout
    done, calls = _run_step(tmp_path / "all", "NVIDIA H200", "gputest", built=[])
    assert done.returncode == 0, done.stdout + done.stderr
    tests = [c for c in calls if "-m pytest" in c]
    assert len(tests) == 2 and "-k bundle_matches" in tests[1], calls


@needs_bash
def test_vit_split_k_times_the_split_form_against_the_family(tmp_path):
    """`vit-split-k`: the family's ViT fp16 and fp8 and the split form (from an edited copy
    of the family folder), built at once, timed together. VIT_SPLIT_BASE=fp16: fp16 and
    the split form only."""
    done, calls = _run_step(tmp_path / "both", "NVIDIA H200", "vit-split-k",
                            built=["vit", "vit-split"])
    assert done.returncode == 0, done.stdout + done.stderr
    _check_split_k(tmp_path / "both", calls, 3)
    root = tmp_path / "split-fp16"
    done, calls = _run_step(root, "NVIDIA H200", "vit-split-k", built=["vit", "vit-split"],
                            extra_env={"VIT_SPLIT_BASE": "fp16"})
    assert done.returncode == 0, done.stdout + done.stderr
    _check_split_k(root, calls, 2)


@needs_bash
def test_r50_tma3x3_builds_and_times_the_3x3_tma_form_beside_the_family(tmp_path):
    """`r50-tma3x3`: timm_resnet50's fp16 and fp8 as the family has them, and fp8 with
    fp8_conv triton-fused-tma-3x3, built at once; the new one verified; the three timed
    with the peer, their replay timelines and their kernels by time at batch 32."""
    done, calls = _run_step(tmp_path, "NVIDIA H100 80GB HBM3", "r50-tma3x3",
                            built=["r50-small", "r50-tma3x3"])
    assert done.returncode == 0, done.stdout + done.stderr
    builds = sorted(c for c in calls if c.startswith("bundle make timm_resnet50"))
    assert len(builds) == 3, calls
    verified = [c for c in calls if "verify --numerics" in c]
    assert len(verified) == 1 and "/r50-tma3x3/timm_resnet50-fp8-" in verified[0], calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "--timeline" in timed[0] and "--profile " in timed[0], calls


@needs_bash
def test_r50_stem_bundles_times_the_fused_stem_against_a_family_copy_without_it(tmp_path):
    """`r50-stem-bundles`: timm_resnet50's fp16 and fp8 as the family has them (the stem
    fused), and fp8 from a family copy whose fp8_fuse_stem is false, built at once; the
    family's fp8 verified; the three timed with the peer and profiled at batch 32."""
    done, calls = _run_step(tmp_path, "NVIDIA H200", "r50-stem-bundles",
                            built=["r50-nostem", "r50-stem"])
    assert done.returncode == 0, done.stdout + done.stderr
    pending = tmp_path / "pending"
    builds = sorted(c for c in calls if c.startswith("bundle make timm_resnet50"))
    assert len(builds) == 3, calls
    copies = _family_copy_builds(calls, pending / "r50-nostem", "timm_resnet50", "fp8_fuse_stem")
    assert len(copies) == 1 and "--precision fp8" in copies[0], builds
    verified = [c for c in calls if "verify --numerics" in c]
    assert len(verified) == 1 and "/r50-stem/timm_resnet50-fp8-" in verified[0], calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "/r50-nostem/timm_resnet50-fp8-" in timed[0], calls
    assert "--profile " in timed[0], calls


@needs_bash
def test_cudnn_family_times_a_familys_pair_with_and_without_timed_cudnn_in_two_processes(
        tmp_path):
    """`cudnn-family`: a family's uint8 fp16 and fp8 from two family copies, cudnn_benchmark
    false and true (the family's own setting is neither baseline), four builds at once;
    each pair timed with the peer in a process of its own (one process would share cuDNN's
    plan cache). CUDNN_FAMILY picks the family."""
    for family, env in (("timm_xception", {}),
                        ("timm_resnet50", {"CUDNN_FAMILY": "timm_resnet50"})):
        done, calls = _run_step(tmp_path / family, "NVIDIA H100 80GB HBM3", "cudnn-family",
                                built=[f"{family}-plain", f"{family}-timed"], extra_env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        pending = tmp_path / family / "pending"
        builds = [c for c in calls if c.startswith(f"bundle make {family} ")]
        assert len(builds) == 4 and all("--input uint8" in c for c in builds), builds
        for form, value in (("plain", "False"), ("timed", "True")):
            copies = _family_copy_builds(calls, pending / f"{family}-{form}", family,
                                         f"a['cudnn_benchmark'] = {value};")
            assert sorted("--precision fp8" in c for c in copies) == [False, True], copies
        timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
        assert len(timed) == 2, calls
        for run, form in zip(timed, ("plain", "timed")):
            assert run.count(f"/{family}-{form}/{family}-") == 2, run
            assert "-fp16-" in run and "-fp8-" in run, run
    # CUDNN_PRECISIONS=fp16: the fp16 pair alone, two builds, one bundle per timing run
    done, calls = _run_step(tmp_path / "fp16", "NVIDIA H200", "cudnn-family",
                            built=["timm_xception-plain", "timm_xception-timed"],
                            extra_env={"CUDNN_PRECISIONS": "fp16"})
    assert done.returncode == 0, done.stdout + done.stderr
    builds = [c for c in calls if c.startswith("bundle make timm_xception ")]
    assert len(builds) == 2 and all("--precision fp16" in c for c in builds), builds
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert [c.count(".bundle") for c in timed] == [1, 1] and all("-fp16-" in c for c in timed)


@needs_bash
def test_study_builds_every_familys_pair_at_once_then_times_each_pair_alone(tmp_path):
    """`study`: issue 18's table on one card. timm_xception's uint8 pair, timm_resnet50's
    and timm_vit_base's pairs, six builds in one step (its limit ends them all), into the
    folders the other steps reuse; then one timing process per family. STUDY_FAMILIES
    narrows both."""
    xception_logs = ["make-timm_xception-fp16-uint8.log", "make-timm_xception-fp8-uint8.log"]
    done, calls = _run_step(tmp_path / "all", "NVIDIA H200", "study",
                            built=xception_logs + ["r50-stem", "vit"])
    assert done.returncode == 0, done.stdout + done.stderr
    pending = tmp_path / "all" / "pending"
    builds = [c for c in calls if c.startswith("bundle make")]
    where = sorted((c.split()[2], c.split(" --out ")[1].split()[0],
                    c.split("--precision ")[1].split()[0]) for c in builds)
    assert where == sorted([("timm_xception", str(pending), "fp16"),
                            ("timm_xception", str(pending), "fp8"),
                            ("timm_resnet50", f"{pending}/r50-stem", "fp16"),
                            ("timm_resnet50", f"{pending}/r50-stem", "fp8"),
                            ("timm_vit_base", f"{pending}/vit", "fp16"),
                            ("timm_vit_base", f"{pending}/vit", "fp8")]), builds
    assert sum("--input uint8" in c for c in builds) == 2, builds
    assert "== study-build: exit 0" in done.stdout
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 3, calls
    for run, family, sizes in zip(timed, ("timm_xception", "timm_resnet50", "timm_vit_base"),
                                  ("1,32", "1,32", "1,2,32")):
        bundles = [w for w in run.split() if w.endswith(".bundle")]
        assert [b.split("/")[-1].split("-")[:2] for b in bundles] == [
            [family, "fp16"], [family, "fp8"]], run
        assert run.endswith(f"--batch-sizes {sizes}"), run
    done, calls = _run_step(tmp_path / "r50", "NVIDIA H100 80GB HBM3", "study",
                            built=["r50-stem", "vit"], extra_env={"STUDY_FAMILIES": "r50"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert {c.split()[2] for c in calls if c.startswith("bundle make")} == {"timm_resnet50"}
    assert [c.count("timm_resnet50-") for c in calls if "aoti_static_vs_peer.py" in c] == [2]


@needs_bash
def test_study_fails_its_build_step_when_a_build_fails(tmp_path):
    """One failed build of the six fails the build step (its exit code said), and the
    timing steps still run on whatever was built."""
    done, calls = _run_step(tmp_path, "NVIDIA H200", "study",
                            built=["r50-stem", "vit"],
                            extra_env={"STUDY_FAMILIES": "vit", "BUNDLE": "false"})
    assert "== study-build: exit 1" in done.stdout, done.stdout + done.stderr
    assert len([c for c in calls if "aoti_static_vs_peer.py" in c]) == 1, calls


@needs_bash
def test_prepare_cudnn_times_the_fp16_preparation_with_and_without_timed_cudnn(tmp_path):
    """`prepare-cudnn`: the build, then the fp16 bundle prepared with cuDNN timed as it
    records, in no graph and in every graph, each replay size timed."""
    done, calls = _run_step(tmp_path, "NVIDIA H100 80GB HBM3", "prepare-cudnn")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([c for c in calls if c.startswith("bundle make")]) == 2, calls
    run = calls[-1]
    assert "prepare_bench.py" in run and "fp16-uint8" in run, calls
    sizes = "graph_sizes=1+2+4+8+16+24+32"
    assert [v.strip() for v in run.split("--variant ")[1:]] == [
        f"bundle:{sizes}", f"untimed:cudnn_benchmark=off,{sizes}",
        f"every-size:cudnn_benchmark=on,{sizes}"], run
    assert "--replay-batches 1,2,4,8,16,24,32 " in run, run


@needs_bash
def test_cudnn_bench_times_each_familys_fp16_with_cudnn_benchmark_off_then_on(tmp_path):
    """`cudnn-bench`: timm_xception's uint8 fp16 and timm_resnet50's fp16 built as the
    families have them, each timed alone with the peer twice,
    without and then with --cudnn-benchmark (a process-wide setting: two processes), the
    second profiled. CUDNN_FAMILIES=r50: that one only."""
    done, calls = _run_step(tmp_path / "both", "NVIDIA H100 80GB HBM3", "cudnn-bench",
                            built=["fp16-r50", "fp16-xception"])
    assert done.returncode == 0, done.stdout + done.stderr
    builds = [c for c in calls if c.startswith("bundle make")]
    assert len(builds) == 2 and all("--precision fp16" in c for c in builds), builds
    assert sum("--input uint8" in c for c in builds) == 1, builds
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 4, calls
    for run, fam in zip((timed[0:2], timed[2:4]), ("xception", "r50")):
        assert all(f"/fp16-{fam}/" in c and c.count(".bundle") == 1 for c in run), run
        assert "--cudnn-benchmark" not in run[0] and "--profile" not in run[0], run
        assert "--cudnn-benchmark" in run[1] and "--profile " in run[1], run
    done, calls = _run_step(tmp_path / "one", "NVIDIA H200", "cudnn-bench",
                            built=["fp16-r50"], extra_env={"CUDNN_FAMILIES": "r50"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c for c in calls if c.startswith("bundle make")][0].startswith(
        "bundle make timm_resnet50"), calls
    assert len([c for c in calls if "aoti_static_vs_peer.py" in c]) == 2, calls


@needs_bash
def test_gaps_runs_the_replay_timelines_and_next_the_pair_on_an_h200(tmp_path):
    """`gaps` on any card (ViT's and ResNet's fp16 and fp8 bundles as the families have
    them, four builds at once, ViT's fp8 verified, each family's pair timed with the peer
    and its graph replays' device timelines taken). `next` on an H200 is issue 15's pair;
    `b1-next` the batch-1 leads: the PDL probe first, on an idle GPU, then timm_vit_base's
    fp16 and fp8 bundles, the fp8 form without static graphs and one with the batch-1 graph
    only, built at once, the family's fp8 verified, the four timed in one process and
    profiled at batch 1."""
    for card in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        done, calls = _run_step(tmp_path / card.split()[1], card, "gaps",
                                built=["r50-small", "vit"])
        assert done.returncode == 0, done.stdout + done.stderr
        builds = sorted(c.split(" --out ")[1] for c in calls if c.startswith("bundle make"))
        pending = tmp_path / card.split()[1] / "pending"
        assert builds == sorted([f"{pending}/r50-small --precision fp16 families=",
                                 f"{pending}/r50-small --precision fp8 families=",
                                 f"{pending}/vit --precision fp16 families=",
                                 f"{pending}/vit --precision fp8 families="]), calls
        verified = [c for c in calls if "verify --numerics" in c]
        assert len(verified) == 1 and "/vit/timm_vit_base-fp8-" in verified[0], calls
        timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
        assert len(timed) == 2 and all("--timeline" in c for c in timed), timed
        assert "timm_vit_base-fp16-" in timed[0] and "--batch-sizes 1,2,32" in timed[0], timed
        assert "timm_resnet50-fp8-" in timed[1] and "--profile-sizes 1,32" in timed[1], timed
        assert not [c for c in calls if "serve_pair_bench.py" in c], calls
    # GAPS_FAMILIES=r50: ResNet's two bundles and their timing only
    done, calls = _run_step(tmp_path / "r50-only", "NVIDIA H200", "gaps", built=["r50-small"],
                            extra_env={"GAPS_FAMILIES": "r50"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c for c in calls if c.startswith("bundle make")] and all(
        "timm_resnet50" in c for c in calls if c.startswith("bundle make")), calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "timm_resnet50-fp16-" in timed[0], timed
    assert not [c for c in calls if "verify --numerics" in c], calls

    done, calls = _run_step(tmp_path / "h200", "NVIDIA H200", "next")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== card: NVIDIA H200" in done.stdout
    builds = [c for c in calls if c.startswith("bundle make timm_xception")]
    assert len(builds) == 2, calls
    pair = [c for c in calls if "serve_pair_bench.py" in c]
    assert len(pair) == 1 and "--workers 16" in pair[0] and "--http-procs 8 " in pair[0] \
        and "--rounds 3" in pair[0] and "--cuda-graph-sizes 1,2,4,8,16,24" in pair[0], pair
    assert not any("-m pytest" in c for c in calls), calls

    done, calls = _run_step(tmp_path / "h100", "NVIDIA H100 80GB HBM3", "b1-next",
                            built=["vit", "vit-b1", "vit-before"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls[0] == "python3 benchmarks/pdl_probe.py", calls
    builds = sorted(c for c in calls if c.startswith("bundle make timm_vit_base"))
    assert len(builds) == 4 and sum("--precision fp8" in c for c in builds) == 3, calls
    assert [c for c in builds if "vit-b1/families" in c], builds
    before = [c for c in builds if "vit-before" in c]
    assert len(before) == 1 and "families=" in before[0] and "vit-before/families" in \
        before[0], builds
    verified = [c for c in calls if "verify --numerics" in c]
    assert len(verified) == 1 and "/vit/timm_vit_base-fp8-" in verified[0], calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "--batch-sizes 1,2,32" in timed[0], calls
    assert "--profile --profile-sizes 1 " in timed[0] and "vit-before/" in timed[0] \
        and "vit-b1/" in timed[0], timed
    assert not [c for c in calls if "serve_pair_bench.py" in c], calls
    # r50-tma-small: ResNet's family bundles and the TMA-small form, built at once, timed
    done, calls = _run_step(tmp_path / "r50", "NVIDIA H100 80GB HBM3", "r50-tma-small",
                            built=["r50-small", "r50-tma-small"])
    assert done.returncode == 0, done.stdout + done.stderr
    builds = sorted(c for c in calls if c.startswith("bundle make timm_resnet50"))
    assert len(builds) == 3 and sum("--precision fp8" in c for c in builds) == 2, calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "--batch-sizes 1,2,4,8,32" in timed[0], calls
    # r50-tma3x3: the same with the 3x3 TMA form, its three bundles timed with timelines
    done, calls = _run_step(tmp_path / "r50-3x3", "NVIDIA H100 80GB HBM3", "r50-tma3x3",
                            built=["r50-small", "r50-tma3x3"])
    assert done.returncode == 0, done.stdout + done.stderr
    builds = sorted(c for c in calls if c.startswith("bundle make timm_resnet50"))
    assert len(builds) == 3 and sum("r50-tma3x3 --precision fp8" in c for c in builds) == 1
    verified = [c for c in calls if "verify --numerics" in c]
    assert len(verified) == 1 and "/r50-tma3x3/timm_resnet50-fp8-" in verified[0], calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "--batch-sizes 1,3,8,32" in timed[0] and "--timeline" in timed[0]
    assert len([w for w in timed[0].split() if w.endswith(".bundle")]) == 3, timed
    # r50-tiles-b1: batch 1's tiles, 20 calls of a layer a graph (the default at batch 1)
    done, calls = _run_step(tmp_path / "tiles-b1", "NVIDIA H100 80GB HBM3", "r50-tiles-b1",
                            built=[])
    assert done.returncode == 0, done.stdout + done.stderr
    tiles = [c for c in calls if "fp8_conv_bench.py" in c]
    assert len(tiles) == 1 and "--fused-layers --batch 1 " in tiles[0], calls
    assert "--budget-s 260" in tiles[0] and "--per-graph" not in tiles[0], tiles
    # tma-small: the probe at batch 1, 4 and 2 with the tiles a package can hold
    done, calls = _run_step(tmp_path / "tma-small", "NVIDIA H100 80GB HBM3", "tma-small",
                            built=[])
    assert done.returncode == 0, done.stdout + done.stderr
    probes = [c for c in calls if "fp8_tma_probe.py" in c]
    assert [c.split("--batch ")[1].split()[0] for c in probes] == ["1", "4", "2"], calls
    assert all("--fit" in c and "--descriptors host" in c for c in probes), probes
    # `next` dispatches the same way, to timm_xception's timing elsewhere
    done, calls = _run_step(tmp_path / "next-h100", "NVIDIA H100 80GB HBM3", "next")
    assert done.returncode == 0, done.stdout + done.stderr
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and "timm_xception-fp8-uint8" in timed[0], calls
    assert not [c for c in calls if "serve_pair_bench.py" in c], calls


@needs_bash
def test_r50_small_builds_the_family_and_the_form_before_and_times_them_at_small_batches(
        tmp_path):
    """`r50-small`: timm_resnet50's fp16 and fp8 bundles as the family has them, and the fp8
    form before its small static graphs, built from a copy of the family folder (with
    static batch 1 only) that the families path puts first; the new fp8 verified, the
    three timed at the small batches and up."""
    repo = tmp_path / "repo"
    shutil.copytree(BENCHMARKS.parent / "families" / "timm_resnet50",
                    repo / "families" / "timm_resnet50")
    done, calls = _run_step(tmp_path, "NVIDIA H100 80GB HBM3", "r50-small",
                            built=["r50-before", "r50-small"])
    assert done.returncode == 0, done.stdout + done.stderr
    pending = tmp_path / "pending"
    makes = [c for c in calls if c.startswith("bundle make timm_resnet50")]
    assert sorted(c.split("--out ")[1] for c in makes) == sorted([
        f"{pending}/r50-small --precision fp16 families=",
        f"{pending}/r50-small --precision fp8 families=",
        f"{pending}/r50-before --precision fp8 families={pending}/r50-before/families"]), calls
    assert (pending / "r50-before/families/timm_resnet50/family.json").exists()
    assert any("verify --numerics" in c for c in calls), calls
    timed = [c for c in calls if "aoti_static_vs_peer.py" in c]
    assert len(timed) == 1 and timed[0].endswith("--batch-sizes 1,2,4,8,16,32"), timed
    assert "r50-before/" in timed[0] and "r50-small/" in timed[0], timed


@needs_bash
def test_load_times_the_activation_with_the_check_on_off_and_on_again(tmp_path):
    """`load`: the build, then the fp16 bundle's load timed by phase, each setting a
    variant of its own."""
    done, calls = _run_step(tmp_path, "NVIDIA H100 80GB HBM3", "load")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([c for c in calls if c.startswith("bundle make")]) == 2, calls
    load = calls[-1]
    assert "prepare_bench.py" in load and "fp16-uint8" in load, calls
    assert load.split("--variant ")[1:] == [
        f"{name}:TRT_BUNDLE_AOTI_LOAD_CHECK={on},graph_sizes=1+2+4+8+16+24 "
        for name, on in (("check-on", 1), ("check-off", 0))] + [
        "check-on-again:TRT_BUNDLE_AOTI_LOAD_CHECK=1,graph_sizes=1+2+4+8+16+24"], load


@needs_bash
@pytest.mark.parametrize("what, tests_k, bench", [
    ("prepare", "prepare or staged", "prepare_bench.py"),
    ("stage", "staged or stages", "serve_bench.py"),
])
def test_prepare_and_stage_run_their_gpu_tests_beside_the_build(tmp_path, what, tests_k, bench):
    """Their GPU tests start beside the build (one log each), the benchmark after both."""
    done, calls = _run_step(tmp_path, "NVIDIA H100 80GB HBM3", what)
    assert done.returncode == 0, done.stdout + done.stderr
    tests = [c for c in calls if "-m pytest" in c]
    assert len(tests) == 1 and tests_k in tests[0], calls
    assert f"== {what}-gputest: exit 0" in done.stdout
    assert (tmp_path / "out" / f"{what}-gputest.log").exists()
    assert [c for c in calls if bench in c] and bench in calls[-1], calls
