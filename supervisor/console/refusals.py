"""The daemon's refusals as the console tells them: in a web user's words, with a link to the
page of the console that helps, never a command line's advice (the daemon's messages are
written for `hunter`: "no turn 7; see `hunter status`").

`refusal_page` is the answer to a refusal of the daemon; `NOT_FOUND` that to a path with no
page. Both are the console's one error page (``error.html``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from supervisor.client import HunterError, NoEvidence, UnknownSession, UnknownTurn
from supervisor.console.render import page

__all__ = ["NOT_FOUND", "Refusal", "refusal_of", "refusal_page", "web_words"]

#: A command line's advice in a daemon's message: "; see `hunter status`", "(see `hunter ...`)".
_CLI_ADVICE: Final = re.compile(r"\s*(?:[;,]\s*see|\(see)\s+`hunter[^`]*`\)?")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the error page says: its status, title, message and where to go from there."""

    status: int
    title: str
    message: str
    #: (path, words) of the console page that helps
    link: tuple[str, str] | None = None

    def page(self, request: Request) -> Response:
        return page(
            request,
            "error.html",
            self.status,
            title=self.title,
            message=self.message,
            link=self.link,
        )


#: The answer to a path with no page.
NOT_FOUND: Final = Refusal(
    404,
    "not found",
    "There is no page at this address.",
    ("/", "Go to the overview"),
)


def web_words(text: str) -> str:
    """*text* (a daemon's message) without its advice to run a command."""
    return _CLI_ADVICE.sub("", text).strip()


def refusal_of(exc: HunterError, request: Request, *, status: int = 502) -> Refusal:
    """How the console tells *exc*, a refusal of the daemon, on the page *request* asked for
    (a missing turn, session or evidence: 404; anything else: *status*)."""
    turn = request.path_params.get("turn_id")
    if isinstance(exc, UnknownTurn):
        which = f"turn {turn}" if turn else "such turn"
        return Refusal(
            404, "not found", f"There is no {which} in this daemon.", ("/turns", "See the turns")
        )
    if isinstance(exc, UnknownSession):
        session = request.path_params.get("session_id")
        which = f"session {session}" if session else "such session"
        return Refusal(
            404,
            "not found",
            f"There is no {which} in this daemon.",
            ("/sessions", "See the sessions"),
        )
    if isinstance(exc, NoEvidence):
        return Refusal(
            404,
            "not found",
            f"Turn {turn} has no evidence stored: its executor sent only a hash of it, or none.",
            (f"/turns/{turn}", f"Back to turn {turn}") if turn else None,
        )
    back = (f"/turns/{turn}", f"Back to turn {turn}") if turn else ("/", "Go to the overview")
    return Refusal(status, exc.code, f"The daemon refused: {web_words(exc.message)}", back)


def refusal_page(request: Request, exc: HunterError, *, status: int = 502) -> Response:
    """The console's error page for *exc* (`refusal_of`)."""
    return refusal_of(exc, request, status=status).page(request)
