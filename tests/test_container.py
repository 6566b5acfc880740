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
    staged = ("build.env", "extra-requirements.txt")  # what the build script stages (stage_build.sh)
    for line in recipe.files:
        source = line.split()[0]
        assert (REPO / source).exists() or source in [f".container/{name}" for name in staged], line
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


def test_both_recipes_install_your_packages_after_the_pinned_stack_from_the_same_staged_file():
    docker, definition = _recipe("DockerParser", DOCKERFILE), _recipe("SingularityParser", DEFINITION)
    install = "python -m ddp_abci.cluster.extras install -r /opt/ddp_abci/build/extra-requirements.txt"
    for steps in (docker.install, definition.install):
        text = "\n".join(steps)
        assert install in text and text.index("--no-deps /opt/ddp_abci") < text.index(install), text
    assert ".container/extra-requirements.txt /opt/ddp_abci/build/extra-requirements.txt" in DOCKERFILE.read_text()
    assert any(line.split()[0] == ".container/extra-requirements.txt" for line in definition.files)


def test_both_recipes_take_torch_index_for_an_older_driver_the_same_way():
    wanted = '${TORCH_INDEX:+--index-url ${TORCH_INDEX}} "torch=='
    assert wanted in DOCKERFILE.read_text() and wanted in DEFINITION.read_text()
    assert "ARG TORCH_INDEX=" in DOCKERFILE.read_text()
    assert ". /opt/ddp_abci/build/build.env" in DEFINITION.read_text()  # staged by build_singularity.sh


@pytest.mark.parametrize("script", ["build_singularity.sh", "build_docker.sh"])
def test_the_build_scripts_stage_your_requirements_and_the_torch_index(tmp_path, script):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("datasets==5.2.0\n")
    staged = REPO / ".container"
    before = staged.exists()
    proc = subprocess.run([str(REPO / "scripts" / "container" / script)], cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env(DRY_RUN="1", BUILD_DIR=str(tmp_path),
                                                            EXTRA_REQUIREMENTS=str(requirements),
                                                            EXTRA_PACKAGES="tokenizers", TORCH_INDEX="https://x/cu128"))
    assert proc.returncode == 0, proc.stdout
    assert "extra-requirements.txt: datasets==5.2.0 tokenizers" in proc.stdout
    assert "TORCH_INDEX=https://x/cu128" in proc.stdout and staged.exists() == before  # a dry run stages nothing


OKPKG = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "{name}"
version = "1.0"
dependencies = ["{needs}"]
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Two packages of a user's, as wheels built here offline: one that takes the image's torch, one
    that asks for a torch the image does not have."""
    out = tmp_path_factory.mktemp("wheels")
    for name, needs in (("okpkg", "torch>=2"), ("badpkg", "torch>=99")):
        source = out / f"{name}-src"
        (source / name).mkdir(parents=True)
        (source / name / "__init__.py").write_text("")
        (source / "pyproject.toml").write_text(OKPKG.format(name=name, needs=needs))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(source)], check=True, stdout=subprocess.DEVNULL)
    return {name: next(out.glob(f"{name}-*.whl")) for name in ("okpkg", "badpkg")}


@pytest.mark.untimed
def test_a_venv_made_without_a_rebuild_sees_the_images_packages_and_refuses_to_move_them(wheels, tmp_path):
    venv = tmp_path / "venv"
    make = [str(REPO / "scripts" / "container" / "make_venv.sh"), str(venv), "--no-index"]
    made = run([*make, str(wheels["okpkg"])], env=env(CONTAINER="none", PYTHON=sys.executable))
    assert made.returncode == 0 and f"VENV={venv}" in made.stdout, made.stdout
    imported = run([str(venv / "bin" / "python"), "-c", "import okpkg, torch, ddp_abci; print(torch.__version__)"])
    assert imported.stdout.strip() == __import__("torch").__version__, imported.stdout  # the image's torch
    refused = run([*make, str(wheels["badpkg"])], env=env(CONTAINER="none", PYTHON=sys.executable))
    errors = [line for line in refused.stdout.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1, refused.stdout
    assert "badpkg 1.0 depends on torch>=99" in errors[0] and "the image has torch" in errors[0]
    assert run([str(venv / "bin" / "python"), "-c", "import badpkg"]).returncode == 1  # nothing installed
