"""Private APT state: fetch package indices, translations and `.deb` files without root.

Nothing touches the system's APT state: lists, caches and the (empty) dpkg status live under the
cache directory, and `Dir::Etc::Parts` points at an empty folder, because container images often
ship `apt.conf.d` snippets such as `Acquire::Languages "none"` that would suppress the
`Translation-xx` files we need. The system's sources and keyrings are used read-only.
Packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`; nothing is installed.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
import shutil
import subprocess
from pathlib import Path

# Description translations to fetch (Debian names the Simplified Chinese one zh_CN).
TRANSLATION_LANGS: tuple[str, ...] = ("en", "de", "fr", "ru", "zh_CN")

# tool -> Debian package that provides it, for the "missing tools" message.
TOOLS: dict[str, str] = {
    "apt-get": "apt",
    "apt-cache": "apt",
    "dpkg-deb": "dpkg",
    "man": "man-db",
    "col": "bsdextrautils",
}
APT_HELPER = "/usr/lib/apt/apt-helper"


class AptError(RuntimeError):
    """A failure of apt or dpkg-deb; the message names the package or file concerned."""


def missing_tools(tools: dict[str, str] | None = None) -> list[str]:
    """Returns `"tool (Debian package)"` for every required tool not on PATH."""
    tools = TOOLS if tools is None else tools
    missing = [f"{t} (package {p})" for t, p in tools.items() if shutil.which(t) is None]
    if not os.access(APT_HELPER, os.X_OK):
        missing.append(f"{APT_HELPER} (package apt)")
    return missing


@dataclasses.dataclass(frozen=True)
class AptState:
    """A private APT configuration rooted at `root` (created by `AptState.create`)."""

    root: Path

    @property
    def config(self) -> Path:
        """The private `apt.conf` passed through `APT_CONFIG`."""
        return self.root / "apt.conf"

    @property
    def lists(self) -> Path:
        """`Dir::State::Lists`: downloaded indices and Translation-xx files."""
        return self.root / "lists"

    @classmethod
    def create(cls, root: str | os.PathLike) -> AptState:
        """Creates (or refreshes) the private directories and `apt.conf` under `root`."""
        state = cls(Path(root).resolve())
        for sub in ("lists/partial", "cache/archives/partial", "etc-parts", "prefs"):
            (state.root / sub).mkdir(parents=True, exist_ok=True)
        status = state.root / "status"
        if not status.exists():
            status.write_text("")
        langs = "".join(f'"{lang}";' for lang in TRANSLATION_LANGS)
        user = getpass.getuser()
        state.config.write_text(
            "\n".join(
                [
                    f'Dir::State "{state.root}";',
                    f'Dir::State::Lists "{state.lists}";',
                    f'Dir::State::status "{status}";',
                    f'Dir::Cache "{state.root / "cache"}";',
                    f'Dir::Cache::archives "{state.root / "cache" / "archives"}";',
                    'Dir::Cache::pkgcache "";',
                    'Dir::Cache::srcpkgcache "";',
                    f'Dir::Etc::Parts "{state.root / "etc-parts"}";',
                    f'Dir::Etc::PreferencesParts "{state.root / "prefs"}";',
                    f'Dir::Log "{state.root / "log"}";',
                    f"Acquire::Languages {{{langs}}};",
                    'Acquire::GzipIndexes "false";',
                    # Snapshot mirrors serve Release files whose Valid-Until has passed.
                    'Acquire::Check-Valid-Until "false";',
                    f'APT::Sandbox::User "{user}";',
                    'APT::Get::AllowUnauthenticated "false";',
                    "",
                ]
            )
        )
        return state

    def env(self) -> dict[str, str]:
        """Returns the environment for apt commands: `APT_CONFIG` plus a C.UTF-8 locale."""
        env = dict(os.environ)
        env.update(APT_CONFIG=str(self.config), LC_ALL="C.UTF-8", DEBIAN_FRONTEND="noninteractive")
        return env

    def run(self, args: list[str], *, what: str, cwd: Path | None = None) -> str:
        """Runs an apt command under this state; raises `AptError` naming `what` on failure."""
        proc = subprocess.run(
            args, env=self.env(), cwd=cwd, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise AptError(
                f"{what}: `{' '.join(args)}` failed ({proc.returncode}): " + " | ".join(tail)
            )
        return proc.stdout

    def update(self) -> None:
        """`apt-get update` into the private lists (indices plus Translation-xx files)."""
        self.run(["apt-get", "update", "-q"], what="apt-get update (private state)")

    def has_lists(self) -> bool:
        """Whether a previous `update` left package indices here."""
        return any(self.lists.glob("*_Packages*"))

    def candidates(self, packages: list[str]) -> dict[str, str]:
        """Returns `{package: candidate version}`; packages without a candidate are left out."""
        out = self.run(["apt-cache", "policy", *packages], what="apt-cache policy")
        versions: dict[str, str] = {}
        current = None
        for line in out.splitlines():
            if line and not line.startswith(" ") and line.endswith(":"):
                current = line[:-1]
            elif current and line.strip().startswith("Candidate:"):
                version = line.split(":", 1)[1].strip()
                if version and version != "(none)":
                    versions[current] = version
        return versions

    def download(self, package: str, version: str, dest: Path) -> Path:
        """Downloads `package=version` into `dest` (kept as a cache) and returns the `.deb`."""
        dest.mkdir(parents=True, exist_ok=True)
        existing = self.deb_path(package, version, dest)
        if existing is not None:
            return existing
        self.run(
            ["apt-get", "download", "-q", f"{package}={version}"],
            what=f"downloading {package} {version}",
            cwd=dest,
        )
        found = self.deb_path(package, version, dest)
        if found is None:
            raise AptError(f"downloading {package} {version}: no .deb appeared in {dest}")
        return found

    def download_many(self, specs: list[tuple[str, str]], dest: Path) -> None:
        """Downloads the not-yet-cached `(package, version)`s in one `apt-get download` (much
        faster than one call each); on failure, retries one by one so the error names the
        package."""
        dest.mkdir(parents=True, exist_ok=True)
        todo = [(p, v) for p, v in specs if self.deb_path(p, v, dest) is None]
        if not todo:
            return
        try:
            self.run(
                ["apt-get", "download", "-q", *(f"{p}={v}" for p, v in todo)],
                what="downloading packages",
                cwd=dest,
            )
        except AptError:
            for package, version in todo:
                self.download(package, version, dest)

    @staticmethod
    def deb_path(package: str, version: str, dest: Path) -> Path | None:
        """Returns the cached `.deb` of `package=version` in `dest`, if any."""
        # apt quotes ':' (epochs) in file names as %3a.
        quoted = version.replace(":", "%3a")
        for path in sorted(dest.glob(f"{package}_*.deb")):
            if path.name.split("_")[1] in (quoted, version):
                return path
        return None

    def translation_files(self, lang: str) -> list[Path]:
        """Returns the private lists' `Translation-<lang>` files (one per suite/component)."""
        names = "|".join(re.escape(n) for n in (lang, lang.replace("_", "%5f")))
        pattern = re.compile(rf"_i18n_Translation-(?:{names})(\.(gz|xz|bz2|lz4|zst))?$")
        return sorted(p for p in self.lists.iterdir() if pattern.search(p.name))

    def read_list_file(self, path: Path) -> str:
        """Returns a lists file as text, decompressing it with apt-helper where needed."""
        if path.suffix in (".gz", ".xz", ".bz2", ".lz4", ".zst"):
            return self.run([APT_HELPER, "cat-file", str(path)], what=f"reading {path}")
        return path.read_text(encoding="utf-8", errors="replace")


def extract_deb(deb: Path, dest: Path) -> Path:
    """Unpacks `deb` into `dest` with `dpkg-deb -x` (atomically: temp dir + rename)."""
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    proc = subprocess.run(
        ["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AptError(f"unpacking {deb.name}: dpkg-deb -x failed: {proc.stderr.strip()}")
    os.replace(tmp, dest)
    return dest
