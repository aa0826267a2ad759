"""Model files named by a hub repo id (`org/name`, optionally `@revision`), resolved into huggingface_hub's cache.

LeRobot users name policies by hub id (`lerobot/pi05_base`), so `model.checkpoint`, `model.tokenizer` and
`oxygen-ros download` take the same ids. Resolution is `huggingface_hub.snapshot_download`, so files land in, and are
read from, the normal hub cache (`HF_HUB_CACHE`, by default `~/.cache/huggingface/hub`) that LeRobot and
transformers share; only the files a pi0.5 policy needs are fetched (`patterns`). Offline (`HF_HUB_OFFLINE=1`) or
without network, the revision's cached snapshot is used; when there is none the error is one line naming the id,
the cache folder and the command that fetches it on a machine with network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id


class HubError(ValueError):
    """A hub id that cannot be resolved to local files; the message is one line that says what to do."""


@dataclass(frozen=True)
class HubId:
    repo_id: str  # org/name
    revision: str | None = None  # branch, tag or commit; None: the repo's default branch

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def download_command(self) -> str:
        return f"oxygen-ros download {self.repo_id}" + (f" --revision {self.revision}" if self.revision else "")

    def cache_folder(self) -> Path:
        """Where huggingface_hub keeps this repo (`models--org--name`, with `refs/`, `snapshots/`, `blobs/`)."""
        return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=self.repo_id, repo_type="model")


def parse_hub_id(text: str) -> HubId | None:
    """`org/name[@revision]` as a HubId; None for text that cannot be one (a path, a bare name, bad characters).

    Exactly one slash is required: a bare name could be a preset or a file, and a path with more parts is a path."""
    name, at, revision = text.strip().partition("@")
    if name.count("/") != 1 or (at and not revision) or name.startswith((".", "~")):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return HubId(name, revision or None)


def snapshot(hub_id: HubId, patterns: tuple[str, ...]) -> Path:
    """The local snapshot folder of `hub_id` holding the files matching `patterns` (fnmatch, as huggingface_hub
    filters), downloaded when the hub can be reached and they are not cached yet; HubError otherwise."""
    try:
        return Path(snapshot_download(hub_id.repo_id, revision=hub_id.revision, allow_patterns=list(patterns)))
    except GatedRepoError:
        raise HubError(f"{hub_id} is a gated repo: accept its terms on its hub page and log in (`hf auth login`), "
                       f"then run `{hub_id.download_command()}`") from None
    except RepositoryNotFoundError:
        raise HubError(f"{hub_id}: no such model repo on the hub (or a private one: log in with `hf auth login`)"
                       ) from None
    except RevisionNotFoundError:
        raise HubError(f"{hub_id}: the repo has no revision {hub_id.revision!r}") from None
    except LocalEntryNotFoundError:
        raise HubError(_not_cached(hub_id)) from None
    except HfHubHTTPError as err:
        raise HubError(f"{hub_id}: the hub answered {str(err).splitlines()[0]}") from None


def _not_cached(hub_id: HubId) -> str:
    folder = hub_id.cache_folder()
    why = "the hub is offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
    refs = sorted(p.name for p in (folder / "refs").glob("*")) if (folder / "refs").is_dir() else []
    cached = f" (cached revisions: {', '.join(refs)})" if refs else ""
    return (f"{hub_id} is not in the hub cache at {folder}{cached} and {why}: run `{hub_id.download_command()}` "
            f"on a machine with network and copy that folder here (same path under HF_HUB_CACHE)")
