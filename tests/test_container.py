"""The container recipes, checked as far as a machine without Docker or Singularity allows:
parsed (spython), the same pinned image from both, and every pin resolved by pip against the
base image's Python from the package index itself, so that a pin the base cannot take fails
here and not on ABCI."""
import json
import re
import subprocess
import sys

import pytest

from helpers import REPO, env, run

DOCKERFILE, DEFINITION = REPO / "scripts/container/Dockerfile", REPO / "scripts/container/ddp_abci.def"


def _recipe(parser_name, path):
    parsers = pytest.importorskip("spython.main.parse.parsers")
    return next(iter(getattr(parsers, parser_name)(str(path)).recipe.values()))


def dockerfile_pins() -> dict[str, str]:
    """name -> version of each ARG X_VERSION of the Dockerfile."""
    return {name.lower(): version for name, version in re.findall(r"ARG (\w+)_VERSION=(\S+)", DOCKERFILE.read_text())}


def base_python() -> str:
    """The base image's Python, from its tag (python:3.12-slim-bookworm -> 3.12)."""
    return re.match(r"python:(\d+\.\d+)-", _recipe("DockerParser", DOCKERFILE).fromHeader)[1]


def test_the_definition_parses_and_copies_files_that_exist():
    recipe = _recipe("SingularityParser", DEFINITION)
    for line in recipe.files:
        assert (REPO / line.split()[0]).exists(), line
    assert any("--no-binary=mpi4py" in step for step in recipe.install)
    assert "python -m ddp_abci.train" in recipe.cmd


def test_the_dockerfile_and_the_definition_build_the_same_pinned_image():
    assert _recipe("DockerParser", DOCKERFILE).fromHeader == _recipe("SingularityParser", DEFINITION).fromHeader
    definition = DEFINITION.read_text()
    pins = dockerfile_pins()
    assert set(pins) == {"torch", "numpy", "mpi4py", "accelerate"}, pins
    for name, version in pins.items():
        assert f'"{name}=={version}"' in definition, name


def test_the_base_and_the_pins_meet_the_projects_own_floors():
    setup = (REPO / "setup.cfg").read_text()
    python_floor = re.search(r"python_requires = >=(\S+)", setup)[1]
    torch_floor = re.search(r"torch>=(\S+)", setup)[1]
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:3])  # noqa: E731
    assert as_tuple(base_python()) >= as_tuple(python_floor)
    assert as_tuple(dockerfile_pins()["torch"]) >= as_tuple(torch_floor)
    tested = __import__("torch").__version__.split("+")[0]
    assert as_tuple(torch_floor) <= as_tuple(tested)  # the floor is a version these tests ran on


def test_every_pin_resolves_for_the_base_images_python(tmp_path):
    """pip resolves each pin for the image's Python and platform from the index's metadata
    (PEP 658: nothing is downloaded), as `pip download --no-deps --python-version X.Y
    --only-binary=:all:` would; a pin the base's Python cannot take fails here."""
    report = tmp_path / "report.json"
    specs = [f"{name}=={version}" for name, version in dockerfile_pins().items()]
    # pip matches the platforms given exactly: the manylinux tags the pins' wheels carry (torch's
    # 2_28, numpy's 2_17, mpi4py's 2_5, whose wheel for the base's Python proves the version takes it;
    # the image builds that version from source against its Open MPI).
    platforms = [arg for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux_2_5", "manylinux1")
                 for arg in ("--platform", f"{tag}_x86_64")]
    proc = run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
                "--python-version", base_python(), "--implementation", "cp", *platforms, "--only-binary=:all:",
                "--target", str(tmp_path / "t"), "--report", str(report), *specs], timeout=300,
               env=env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert proc.returncode == 0, proc.stdout
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    assert resolved == dockerfile_pins(), resolved


def test_the_build_scripts_take_their_scratch_folders_from_build_dir_and_check_mpi4py_mpi():
    for script in ("scripts/container/build_singularity.sh", "scripts/container/build_docker.sh"):
        text = (REPO / script).read_text()
        assert "SINGULARITY_TMPDIR=${SINGULARITY_TMPDIR:-$BUILD_DIR/" in text
        assert "SINGULARITY_CACHEDIR=${SINGULARITY_CACHEDIR:-$BUILD_DIR/" in text
        assert "import mpi4py.MPI" in text and "ompi_info --version" in text
    for recipe in (DOCKERFILE, DEFINITION):
        assert "import ddp_abci, mpi4py.MPI as M" in recipe.read_text()


def test_the_singularity_build_as_written_in_its_dry_run_form(tmp_path):
    proc = subprocess.run([str(REPO / "scripts/container/build_singularity.sh")], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env(DRY_RUN="1", BUILD_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout
    assert "dry run: singularity build --fakeroot ddp_abci.sif scripts/container/ddp_abci.def" in proc.stdout
    assert not list(tmp_path.iterdir())  # a dry run makes no folder
