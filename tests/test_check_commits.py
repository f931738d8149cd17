"""scripts/check-commits.sh, which .ci/run runs first: commit subjects of at most 72
characters, over the commits since the last tag or the last 50, after the script's baseline,
in a full or a shallow clone.

Each test makes a git repository of empty commits in a temporary directory and runs the
script on it, as CI does on its clone (e2e: a script of scripts/; a few seconds).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import helpers

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check-commits.sh"
SHORT = "Fit: a subject of a sensible length"
LONG = "x" * 73  # one character over the limit
AT_LIMIT = "y" * 72


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def repository(path: Path, *subjects: str) -> Path:
    """A repository of one empty commit per subject, oldest first."""
    path.mkdir()
    git(path, "init", "-q")
    for subject in subjects:
        git(path, "commit", "-q", "--allow-empty", "-m", subject, "-m", "A body of any length.")
    return path


def check(repo: Path, baseline: str = "") -> subprocess.CompletedProcess:
    # git looks no higher than the temporary directory for a repository
    ceiling = str(repo.parent)
    env = {**os.environ, "CHECK_COMMITS_BASELINE": baseline, "GIT_CEILING_DIRECTORIES": ceiling}
    return helpers.run_command(["bash", SCRIPT, repo], env=env, timeout=60)


def test_a_subject_over_72_characters_fails_naming_its_hash_and_length(tmp_path):
    repo = repository(tmp_path / "r", SHORT, LONG, AT_LIMIT)
    done = check(repo)
    assert done.returncode == 1, done.stdout + done.stderr
    long_hash = git(repo, "rev-parse", "--short", "HEAD~1")
    assert f"{long_hash}: subject of 73 characters (at most 72): {LONG}" in done.stdout
    assert "1 of 3 commit subject(s) (the last 50) over 72" in done.stdout
    assert AT_LIMIT not in done.stdout and SHORT not in done.stdout


def test_subjects_of_at_most_72_characters_pass(tmp_path):
    repo = repository(tmp_path / "r", SHORT, AT_LIMIT, "Ünïcödé: counted in characters " + "é" * 41)
    done = check(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 commit subject(s) (the last 50), none over 72 characters" in done.stdout


def test_only_the_last_50_commits_since_the_last_tag_after_the_baseline_count(tmp_path):
    repo = repository(tmp_path / "r", LONG, *[f"Step {i}" for i in range(50)])
    assert check(repo).returncode == 0  # the long one is the 51st from HEAD
    git(repo, "commit", "-q", "--allow-empty", "-m", LONG + " again")
    assert check(repo).returncode == 1
    git(repo, "tag", "v1")  # a tag on it: the commits after it only
    git(repo, "commit", "-q", "--allow-empty", "-m", SHORT)
    done = check(repo)
    assert done.returncode == 0, done.stdout
    assert "1 commit subject(s) (since the tag v1, at most 50)" in done.stdout

    other = repository(tmp_path / "o", SHORT, LONG, SHORT)
    assert check(other).returncode == 1
    long_hash = git(other, "rev-parse", "HEAD~1")
    assert check(other, baseline=long_hash).returncode == 0  # it and its ancestors: not checked
    git(other, "commit", "-q", "--allow-empty", "-m", LONG)
    assert check(other, baseline=long_hash).returncode == 1  # one after it is


def test_a_shallow_clone_checks_the_commits_it_holds(tmp_path):
    repo = repository(tmp_path / "r", SHORT, LONG, *[f"Step {i}" for i in range(3)])
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "2", repo.as_uri(), str(clone))
    assert git(clone, "rev-parse", "--is-shallow-repository") == "true"
    done = check(clone, baseline=git(repo, "rev-parse", "HEAD~3"))  # not in the clone
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 commit subject(s) (the last 50)" in done.stdout
    deeper = tmp_path / "deeper"
    git(tmp_path, "clone", "-q", "--depth", "4", repo.as_uri(), str(deeper))
    done = check(deeper)
    assert done.returncode == 1 and LONG in done.stdout, done.stdout + done.stderr


def test_outside_a_git_checkout_nothing_is_checked(tmp_path):
    done = check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "not a git checkout" in done.stdout


def test_a_merge_commit_is_not_checked(tmp_path):
    """The merge CI checks out for a pull request has git's subject "Merge <sha> into <sha>"
    (92 characters)."""
    repo = repository(tmp_path / "r", SHORT)
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "topic")
    git(repo, "commit", "-q", "--allow-empty", "-m", "Topic: a short subject")
    topic = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", base)
    git(repo, "merge", "-q", "--no-ff", "-m", f"Merge {topic} into {base}", "topic")
    done = check(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 commit subject(s) (the last 50), none over 72" in done.stdout
