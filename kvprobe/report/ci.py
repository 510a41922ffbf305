"""What a CI job reads besides the exit code: a JUnit file and a Markdown step summary.

`--junit FILE` and `--summary FILE` on eval and canary; with no --summary, $GITHUB_STEP_SUMMARY when
it is set (appended to, as GitHub Actions expects). A run that ends before its verdict still writes
both, saying why, so a test report never shows green for a run that measured nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe import settings
from kvprobe.errors import CiOutputError
from kvprobe.report.junit import junit_xml, no_verdict_xml
from kvprobe.report.step_summary import step_summary


@dataclass
class CiOutputs:
    junit: Path | None = None
    summary: Path | None = None

    @classmethod
    def from_options(cls, junit: Path | None, summary: Path | None) -> CiOutputs:
        return cls(junit, summary or settings.github_step_summary())

    def write(self, verdict: dict[str, Any] | None, run_dir: Path | None, signature: dict[str, Any] | None = None,
              exit_code: int | None = None, notes: list[str] | None = None) -> list[Path]:
        """Write what was asked; `verdict` None: the run ended before one (`notes` say why)."""
        written = []
        if self.junit is not None:
            why = "; ".join(notes or []) or "the run ended before its verdict"
            self._put(self.junit, junit_xml(verdict, notes) if verdict else no_verdict_xml(why), append=False)
            written.append(self.junit)
        if self.summary is not None:
            if verdict:
                text = step_summary(verdict, run_dir or Path("."), signature, exit_code, notes)
            else:
                text = "## kvprobe: no verdict\n\n" + "\n".join(f"- {n}" for n in notes or []) + \
                       f"\n\nexit code {exit_code}\n"
            self._put(self.summary, text.encode(), append=True)
            written.append(self.summary)
        return written

    @staticmethod
    def _put(path: Path, data: bytes, append: bool) -> None:
        try:
            with open(path, "ab" if append else "wb") as f:
                f.write(data)
        except OSError as exc:
            raise CiOutputError(f"cannot write {path}: {exc.strerror or exc}") from None
