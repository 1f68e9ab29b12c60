"""payonce as a user gets it: the sdist and wheel that ``python -m build`` makes, installed
with pip into a clean virtual environment.

The wheel must carry the licence and the typing marker, run the ``payonce`` command and
import with nothing but the core dependencies: the extras (the sandbox's web server,
PostgreSQL, FastAPI, aiohttp) are for those who ask for them.
"""

from __future__ import annotations

import email.message
import email.parser
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

import payonce

# Each test builds or installs for real (pip into a fresh virtualenv): on a loaded 2-core
# machine one took over the suite's 120 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]

# Read at import, before the autouse fixture points HOME at a temporary directory: building
# and installing use pip as this machine has it set up (its index settings and its cache).
_PIP_ENVIRONMENT = {
    name: value
    for name, value in os.environ.items()
    if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
}

# What only an extra brings, and the dev tools: none may come with a plain install.
EXTRAS_ONLY = {
    "starlette",
    "uvicorn",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "fastapi",
    "aiohttp",
    "httpx-aiohttp",
    "stripe",
    "adyen",
    "mollie-api-python",
    "squareup",
    "requests",
    "pytest",
    "keyrings-alt",
}


@attrs.frozen
class Dist:
    sdist: Path
    wheel: Path


def _run(command: list[str | Path], **options: Any) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; on failure, show what it printed."""
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        **options,
    )
    assert done.returncode == 0, (
        f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build``: the sdist, then the wheel built from that sdist (so a file the
    sdist lacks is missing from the wheel too)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], env=_PIP_ENVIRONMENT)
    (sdist,) = out.glob("payonce-*.tar.gz")
    (wheel,) = out.glob("payonce-*-py3-none-any.whl")
    return Dist(sdist=sdist, wheel=wheel)


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _sdist_files(sdist: Path) -> dict[str, bytes]:
    files = {}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                # Without the top folder, payonce-VERSION/.
                files[member.name.split("/", 1)[1]] = extracted.read()
    return files


def _metadata(wheel: Path) -> email.message.Message:
    files = _wheel_files(wheel)
    (name,) = (name for name in files if name.endswith(".dist-info/METADATA"))
    return email.parser.BytesParser().parsebytes(files[name])


def test_the_licence_and_the_typing_marker_are_in_the_sdist_and_the_wheel(dist: Dist) -> None:
    licence = (ROOT / "LICENSE").read_bytes()
    assert b"MIT License" in licence
    assert b"Copyright (c) 2026 The payonce developers" in licence

    sdist = _sdist_files(dist.sdist)
    assert sdist["LICENSE"] == licence
    assert "src/payonce/py.typed" in sdist

    wheel = _wheel_files(dist.wheel)
    (licence_in_wheel,) = (name for name in wheel if name.endswith(".dist-info/licenses/LICENSE"))
    assert wheel[licence_in_wheel] == licence
    assert "payonce/py.typed" in wheel


def test_the_metadata_names_the_licence_the_project_urls_and_the_classifiers(dist: Dist) -> None:
    metadata = _metadata(dist.wheel)

    assert metadata["Name"] == "payonce"
    assert metadata["Version"] == payonce.__version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE"
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL", []))
    assert set(urls) == {"Documentation", "Changelog", "Source", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = set(metadata.get_all("Classifier", []))
    assert {
        "Development Status :: 3 - Alpha",
        "Framework :: AsyncIO",
        "Intended Audience :: Developers",
        "Topic :: Office/Business :: Financial",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
    } <= classifiers
    # The licence expression says it: PEP 639 deprecates licence classifiers beside one.
    assert not any(classifier.startswith("License ::") for classifier in classifiers)


def _installed(site_packages: Path) -> dict[NormalizedName, importlib.metadata.Distribution]:
    return {
        canonicalize_name(found.metadata["Name"]): found
        for found in importlib.metadata.distributions(path=[str(site_packages)])
    }


def _dependency_closure(
    root: importlib.metadata.Distribution,
    installed: dict[NormalizedName, importlib.metadata.Distribution],
) -> set[NormalizedName]:
    """Every distribution ``root`` requires, with no extra of its own asked for, and what
    those require in turn (with the extras they ask of each other)."""
    needed: set[NormalizedName] = set()
    todo: list[tuple[importlib.metadata.Distribution, Iterable[str]]] = [(root, ("",))]
    seen: set[tuple[NormalizedName, str]] = set()
    while todo:
        distribution, extras = todo.pop()
        for extra in extras:
            name = canonicalize_name(distribution.metadata["Name"])
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for line in distribution.requires or ():
                requirement = Requirement(line)
                if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
                    continue
                dependency = canonicalize_name(requirement.name)
                assert dependency in installed, f"{name} needs {line!r}: not installed"
                needed.add(dependency)
                todo.append((installed[dependency], ("", *sorted(requirement.extras))))
    return needed


def test_the_wheel_in_a_clean_venv_runs_the_command_and_imports_with_only_core_dependencies(
    dist: Dist, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    site_packages = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    before = set(_installed(site_packages))  # pip itself, and setuptools on Python 3.11

    _run([python, "-m", "pip", "install", dist.wheel], env=_PIP_ENVIRONMENT, cwd=tmp_path)

    installed = _installed(site_packages)
    brought = set(installed) - before - {"payonce"}
    core = {canonicalize_name(Requirement(line).name) for line in _core_dependencies()}
    assert core <= brought
    assert brought == _dependency_closure(installed["payonce"], installed)
    assert brought & EXTRAS_ONLY == set()

    # Run from elsewhere than the checkout, with nothing on the path but the venv.
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    run_there = {"cwd": tmp_path, "env": environment}
    imported = _run(
        [
            python,
            "-c",
            "import json, payonce; print(json.dumps([payonce.__file__, payonce.__version__]))",
        ],
        **run_there,
    )
    location, version = json.loads(imported.stdout)
    assert Path(location).is_relative_to(site_packages)
    assert version == payonce.__version__

    for command in ([venv / "bin" / "payonce", "--help"], [python, "-m", "payonce", "--help"]):
        helped = _run(command, **run_there)
        assert helped.stdout.startswith("Usage: ")
        for name in ("resume", "reconcile", "intents", "journal", "sandbox"):
            assert name in helped.stdout
    assert (
        _run([venv / "bin" / "payonce", "--version"], **run_there)
        .stdout.strip()
        .endswith(payonce.__version__)
    )


def _core_dependencies() -> list[str]:
    """[project].dependencies of pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        return list(tomllib.load(file)["project"]["dependencies"])
