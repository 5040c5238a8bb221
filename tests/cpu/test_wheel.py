"""The package as a user gets it: `python -m build` over the files a commit would hold, the wheel
installed into a fresh virtual environment, and `pcg-synth --version`, `kit build` and a kit job
run from that install in a folder outside the checkout; then the same wheel carried to a Ray
cluster by cluster/runtime-env.yaml, to nodes that have the dependencies but no pcg-synth. A
module or data file the package does not ship, or an import that resolves only from the
checkout, fails here and nowhere else.

Nothing is downloaded. A fresh environment sees this interpreter's site-packages through a .pth
line: that puts them on its path without processing their own .pth files, so the editable
install's pointer to the checkout is never followed. The wheel is installed with --no-index, so a
requirement it declares that is not installed here fails the install; Ray's pip on the node then
finds every requirement installed too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml

import engine

from conftest import free_port, ray_address_file_kept
from jobhelpers import texts, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def commit_files() -> list[str]:
    """The tree's files as a commit of it would hold them: tracked, and untracked but not ignored."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the repository's git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    return [f for f in listed.split("\0") if f and (ROOT / f).is_file()]


def clean_env(bindir: Path) -> dict[str, str]:
    """This environment without anything that would reach the checkout or another Python: no
    PYTHONPATH, no RAY_ADDRESS, and a PATH of `bindir` then the system's folders that hold no
    `pcg-synth` (this checkout's virtualenv has one)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "pcg-synth").exists()]
    env["PATH"] = os.pathsep.join([str(bindir), *path])
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def fresh_env(where: Path) -> Path:
    """A new virtual environment of this Python over this interpreter's site-packages (module
    docstring); returns its folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    layers = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert str(ROOT) not in layers
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(where / "bin" / "python"), "-c", ask], capture_output=True, text=True,
                             check=True).stdout.strip()
    (Path(purelib) / "_pcg_synth_test_dependencies.pth").write_text("\n".join(layers) + "\n")
    return where


def run(argv: list, env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def kit_job(folder: Path, output: str) -> Path:
    """A four-row PCG job over the kit in `folder`, its paths relative to the spec's folder."""
    write_manifest(folder / "rows.jsonl", texts(4))
    spec = {"name": "wheel-job", "models": {"target": "kit/target", "draft": "kit/draft", "codec": "kit/codec"},
            "decoding": {"method": "pcg", "gamma": 3, "theta": 0.4, "max_new_tokens": 16, "seed": 1},
            "input": {"manifests": ["rows.jsonl"]}, "output": {"uri": output, "audio_format": "flac"},
            "resources": {"workers": 1, "cpus_per_worker": 1, "batch_size": 4, "rows_per_shard": 2}}
    path = folder / f"{output}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel `python -m build` makes from a copy of the commit's files (the
    wheel is built from the unpacked sdist, as pip does from PyPI's)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in commit_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, src], os.environ, src)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh environment with the wheel installed by pip, its dependencies checked."""
    venv = fresh_env(tmp_path_factory.mktemp("wheel-env") / "venv")
    run([venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--quiet",
         dist["wheel"]], clean_env(venv / "bin"), venv)
    return venv


@pytest.fixture(scope="module")
def work(installed, tmp_path_factory) -> Path:
    """A folder outside the checkout holding the kit that the installed `pcg-synth kit build` wrote."""
    folder = tmp_path_factory.mktemp("user")
    built = run([installed / "bin" / "pcg-synth", "kit", "build", "kit"], clean_env(installed / "bin"), folder)
    assert "tiny llasa kit written to kit" in built.stdout and (folder / "kit" / "kit.json").is_file()
    return folder


def test_the_wheel_and_sdist_ship_every_file_of_the_package(dist):
    package = {f for f in commit_files() if f.startswith("engine/")}
    assert "engine/py.typed" in package and "engine/kit/build.py" in package
    wheel = set(zipfile.ZipFile(dist["wheel"]).namelist())
    assert package <= wheel, f"not in the wheel: {sorted(package - wheel)}"
    assert {f for f in wheel if f.startswith("engine/")} == package  # and nothing else (no bytecode)
    with tarfile.open(dist["sdist"]) as sdist:
        top = dist["sdist"].name.removesuffix(".tar.gz")
        shipped = {n.removeprefix(top + "/") for n in sdist.getnames()}
    assert package | {"README.md", "pyproject.toml"} <= shipped, f"not in the sdist: {sorted(package - shipped)}"
    metadata = zipfile.ZipFile(dist["wheel"]).read(f"{top}.dist-info/METADATA").decode()
    assert f"\nVersion: {engine.__version__}\n" in metadata  # the version has one home: engine/__init__.py
    assert "Requires-Dist: torch>=" in metadata and "Provides-Extra: gpu" in metadata


def installed_wheel_version(venv: Path) -> str:
    (record,) = venv.glob("lib/python*/site-packages/pcg_synth-*.dist-info")
    return record.name.removeprefix("pcg_synth-").removesuffix(".dist-info")


def test_the_installed_wheel_runs_a_kit_job_outside_the_checkout(installed, work):
    env, pcg = clean_env(installed / "bin"), installed / "bin" / "pcg-synth"
    where = run([installed / "bin" / "python", "-c", "import engine; print(engine.__file__)"], env, work)
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout  # the wheel's engine, not the checkout's
    version = installed_wheel_version(installed)
    assert run([pcg, "--version"], env, work).stdout.strip() == f"pcg-synth {version}"
    done = run([pcg, "run", kit_job(work, "out"), "--address", "local", "--quiet"], env, work)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows_ok"] == 4 and summary["rows_failed"] == 0 and summary["audio_seconds"] > 0
    assert len(list((work / "out" / "data").glob("*.parquet"))) == 2


@pytest.fixture
def bare_node(tmp_path_factory):
    """A Ray head (`ray start --head`, with the Jobs API) whose Python has pcg-synth's
    dependencies and not pcg-synth: a node of a cluster that gets the engine from the job's
    runtime environment. Yields the Jobs API address."""
    from ray.job_submission import JobSubmissionClient

    venv = fresh_env(tmp_path_factory.mktemp("node-env") / "venv")
    env = clean_env(venv / "bin")
    missing = subprocess.run([venv / "bin" / "python", "-c", "import engine"], env=env, cwd=venv, capture_output=True)
    assert missing.returncode != 0 and shutil.which("pcg-synth", path=env["PATH"]) is None  # no engine here
    # every port its own: the job agent's default (52365) is taken by any other Ray on the machine,
    # and a head without its job agent refuses jobs
    port, dash, agent = free_port(), free_port(), free_port()
    ray_cli = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
    with ray_address_file_kept():
        head = subprocess.Popen([venv / "bin" / "python", "-c", ray_cli, "start", "--head", f"--port={port}",
                                 f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}", "--num-cpus=2",
                                 "--include-dashboard=true", "--block"],
                                env=env, cwd=venv, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address, deadline = f"http://127.0.0.1:{dash}", time.time() + 300
        try:
            while True:
                try:
                    JobSubmissionClient(address)
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
                    time.sleep(1)
            yield address
        finally:
            os.killpg(head.pid, signal.SIGKILL)  # its whole session: gcs, raylet, dashboard, workers
            head.wait(timeout=60)


def test_the_runtime_environment_brings_the_wheel_to_nodes_without_pcg_synth(installed, work, dist, bare_node):
    address = bare_node
    env, pcg = clean_env(installed / "bin"), installed / "bin" / "pcg-synth"
    (work / "dist").mkdir(exist_ok=True)
    shutil.copy2(dist["wheel"], work / "dist")  # as `python -m build` leaves it in the checkout
    runtime_env = ROOT / "cluster" / "runtime-env.yaml"
    assert "dist/pcg_synth-*.whl" in yaml.safe_load(runtime_env.read_text())["pip"]["packages"]
    sent = run([pcg, "submit", kit_job(work, "cluster-out"), "--address", address, "--runtime-env", runtime_env],
               env, work)
    job_id = sent.stdout.split()[1]
    done = subprocess.run([pcg, "status", job_id, "--address", address, "--wait"], env=env, cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert f"{job_id}: SUCCEEDED" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    summary = json.loads((work / "cluster-out" / "summary.json").read_text())
    assert summary["rows_ok"] == 4 and summary["rows_failed"] == 0


def test_submit_ships_the_one_wheel_a_pip_entry_names_and_says_when_there_is_none_or_several(tmp_path, monkeypatch):
    from engine.runtime.submit import ship_wheels

    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    env = {"pip": {"packages": ["dist/pcg_synth-*.whl[gpu]", "requests>=2", "https://example.org/x-1.0-py3-none-any.whl"]},
           "env_vars": {"A": "1"}}
    with pytest.raises(ValueError, match=r"matches no file .*python -m build --wheel"):
        ship_wheels(env, work)
    (tmp_path / "dist").mkdir()
    wheel = tmp_path / "dist" / "pcg_synth-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    shipped = ship_wheels(env, work)
    entry, *others = shipped["pip"]["packages"]
    assert others == ["requests>=2", "https://example.org/x-1.0-py3-none-any.whl"] and shipped["env_vars"] == {"A": "1"}
    assert entry.startswith("${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/wheels/") and entry.endswith(f"/{wheel.name}[gpu]")
    copy = work / entry.split("}/", 1)[1].removesuffix("[gpu]")
    assert copy.read_bytes() == b"a wheel"
    wheel.write_bytes(b"a rebuilt wheel")  # same name, new content: a new folder, so Ray makes a new environment
    assert ship_wheels(env, work)["pip"]["packages"][0] != entry
    (tmp_path / "dist" / "pcg_synth-0.2.0-py3-none-any.whl").write_bytes(b"another")
    with pytest.raises(ValueError, match=r"matches 2 files .*0\.1\.0.*0\.2\.0.*: name one"):
        ship_wheels(env, work)
