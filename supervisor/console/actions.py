"""What an operator may change: resolve an escalation (retry or terminate) and cancel a turn.
Both are POSTs from the console's own forms, with the sign-in's CSRF token, by a resolver, with
a reason; the daemon records the signed-in operator's name and the reason (and the console's
uid, from the socket) as the decision's ``decided_by``, in the evidence ledger and the turn.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from supervisor.client import ConnectionLost, HunterError
from supervisor.console import ids
from supervisor.console.errors import BadId
from supervisor.console.guard import (
    FormRefused,
    authenticate,
    post_refused,
    read_form,
    refusal,
    state_of,
)
from supervisor.console.refusals import refusal_page
from supervisor.console.render import page
from supervisor.logging import get_logger

__all__ = ["ROUTES"]

_LOG: Final = get_logger("supervisor.console")


async def _decision(request: Request) -> tuple[int, dict[str, str], str, str] | Response:
    """The checked decision: (turn id, form, operator, reason), or the refusal to answer (a
    turn id no turn can have is 404 here: the daemon is not asked)."""
    signin = authenticate(request)
    if isinstance(signin, Response):
        return signin
    request.state.signin = signin
    try:
        turn_id = ids.turn_id(request.path_params["turn_id"])
    except BadId as exc:
        return page(request, "error.html", exc.status, title="not found", message=str(exc))
    try:
        form = await read_form(request)
    except FormRefused as exc:
        return refusal(exc)
    refused = post_refused(request, signin, form)
    if refused is not None:
        _LOG.warning(
            "console_post_refused",
            operator=signin.operator,
            path=request.url.path,
            status=refused.status_code,
        )
        return refused
    if not signin.role.may_decide:
        _LOG.warning("console_role_refused", operator=signin.operator, path=request.url.path)
        return PlainTextResponse(
            f"refused: {signin.operator} is a {signin.role.value}; only a resolver may decide",
            403,
        )
    reason = form.get("reason", "").strip()
    if not reason:
        return PlainTextResponse("a reason is required: say why, in words", 400)
    return turn_id, form, signin.operator, reason[:1000]


def _unreachable(request: Request) -> Response:
    problem = state_of(request).link.problem
    return page(request, "unreachable.html", 503, problem=problem, follow="reconnect")


async def resolve(request: Request) -> Response:
    checked = await _decision(request)
    if isinstance(checked, Response):
        return checked
    turn_id, form, operator, reason = checked
    action = form.get("action", "")
    if action not in {"retry", "terminate"}:
        return PlainTextResponse("action: must be retry or terminate", 400)
    client = state_of(request).link.client
    if client is None:
        return _unreachable(request)
    try:
        await client.resolve(turn_id, action, reason=reason, operator=operator)
    except HunterError as exc:
        return refusal_page(request, exc, status=409)
    except ConnectionLost:  # not sent again: the operator sees the turn and decides anew
        return _unreachable(request)
    _LOG.info("console_resolved", operator=operator, turn_id=turn_id, action=action)
    return RedirectResponse(f"/turns/{turn_id}?done={action}", status_code=303)


async def cancel(request: Request) -> Response:
    checked = await _decision(request)
    if isinstance(checked, Response):
        return checked
    turn_id, _form, operator, reason = checked
    client = state_of(request).link.client
    if client is None:
        return _unreachable(request)
    try:
        await client.cancel(turn_id, reason=reason, operator=operator)
    except HunterError as exc:
        return refusal_page(request, exc, status=409)
    except ConnectionLost:
        return _unreachable(request)
    _LOG.info("console_cancelled", operator=operator, turn_id=turn_id)
    return RedirectResponse(f"/turns/{turn_id}?done=cancel", status_code=303)


ROUTES: Final = (
    ("/escalations/{turn_id}/resolve", resolve),
    ("/turns/{turn_id}/cancel", cancel),
)
