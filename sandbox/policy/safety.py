"""Phase-20 safety harness: build instructions, judge untrusted executor responses.

Pure functions, no I/O. ``build_executor_instruction`` validates request data and raises
``InstructionError(field=..., reason=...)``. ``validate_executor_response`` takes the decoded
JSON object an executor sent (untrusted, any shape) and never raises: it returns an
``ExecutionSafetyResult`` that either carries a frozen ``ExecutorResponseEnvelope`` or says, with
its own reason code, why the response is DENIED.

Order of the response checks (docs/policy.md explains why):

1. the caller's instruction is an ``ExecutorInstructionEnvelope`` (else ``INSTRUCTION_INVALID``);
2. the response is a JSON object with string keys (``RESPONSE_MALFORMED``);
3. size bounds: nesting depth, node count, string length (``RESPONSE_TOO_LARGE``);
4. authority claims anywhere, also nested in ``output`` (``RESPONSE_CLAIMS_AUTHORITY``) -
   checked before everything else so a lying response is always flagged as a security matter;
5. top-level fields outside the allow-list (``RESPONSE_UNKNOWN_FIELD``);
6. instruction id missing / wrong type / mismatched;
7. response type unknown; 8. other field types; 9. evidence hash format;
10. SUCCESS without evidence hash (``SUCCESS_WITHOUT_EVIDENCE``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from sandbox.policy import reason_codes as rc
from sandbox.policy.envelopes import (
    ExecutionSafetyResult,
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorResponseEnvelope,
    ExecutorResponseType,
    ParameterValue,
    deep_thaw,
)
from sandbox.policy.errors import InstructionError

__all__ = [
    "AUTHORITY_KEYS",
    "MAX_RETRY_AFTER_MS",
    "MAX_TIMEOUT_MS",
    "InstructionError",
    "build_executor_instruction",
    "enforce_executor_safety",
    "instruction_from_wire",
    "instruction_to_wire",
    "response_to_wire",
    "validate_executor_response",
]

#: Upper bound of an instruction's timeout: ten minutes.
MAX_TIMEOUT_MS: Final = 600_000
MAX_ID_CHARS: Final = 128
MAX_TIMESTAMP_CHARS: Final = 64
MAX_URL_CHARS: Final = 2048
MAX_SELECTOR_CHARS: Final = 1024
MAX_PARAMETERS: Final = 32
MAX_PARAMETER_KEY_CHARS: Final = 64
MAX_PARAMETER_VALUE_CHARS: Final = 4096
MAX_PARAMETER_INT: Final = 2**53
# Response bounds (a frame is at most 1 MiB; these bound the work of the scan).
MAX_RESPONSE_DEPTH: Final = 32
MAX_RESPONSE_NODES: Final = 10_000
MAX_RESPONSE_STRING_CHARS: Final = 1_048_576

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_PARAM_KEY_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_WHITESPACE_RE: Final = re.compile(r"\s")
_URL_RE: Final = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>[/?#].*)?", re.DOTALL
)
_HOST_RE: Final = re.compile(
    r"(?:(?P<name>[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?)"
    r"|\[(?P<ipv6>[0-9A-Fa-f:.]+)\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
)
_EVIDENCE_RE: Final = re.compile(r"[0-9a-f]{64}")

_URL_COMMANDS: Final = frozenset({ExecutorCommandType.NAVIGATE})
_SELECTOR_REQUIRED: Final = frozenset(
    {ExecutorCommandType.CLICK, ExecutorCommandType.READ, ExecutorCommandType.EXTRACT}
)
_SELECTOR_OPTIONAL: Final = frozenset({ExecutorCommandType.SCROLL, ExecutorCommandType.SCREENSHOT})

#: Normalised keys that claim supervisor authority when found anywhere in a response.
AUTHORITY_KEYS: Final = frozenset(
    {
        "decision",
        "sandbox_decision",
        "verdict",
        "retry_policy",
        "policy",
        "max_retries",
        "max_attempts",
        "attempt_number",
        "retry_budget",
        "retries",
        "capability",
        "capabilities",
        "grant",
        "grants",
        "permissions",
        "escalate",
        "escalation",
        "authority",
        "privileges",
        "instruction_results",
        "result_for",
        "override",
    }
)
#: Keys whose value, when it names another instruction/execution, claims another one's result.
_IDENTITY_KEYS: Final = ("instruction_id", "execution_id")

_RESPONSE_FIELDS: Final = frozenset(
    {
        "instruction_id",
        "response_type",
        "evidence_hash",
        "error_message",
        "timestamp",
        "output",
        "partial",
        "retry_after_ms",
    }
)
#: The longest ``retry_after_ms`` a response may carry (one hour); the policy caps it further
#: at ``RetryOptions.max_delay_ms``.
MAX_RETRY_AFTER_MS: Final = 3_600_000
_CAMEL_RE: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


# --------------------------------------------------------------------------- instructions
def _check_id(field: str, value: object) -> str:
    if not isinstance(value, str) or value == "":
        raise InstructionError(field=field, reason="must be a non-empty string")
    if len(value) > MAX_ID_CHARS:
        raise InstructionError(field=field, reason=f"longer than {MAX_ID_CHARS} characters")
    if _ID_RE.fullmatch(value) is None:
        raise InstructionError(field=field, reason="only letters, digits and . _ : - are allowed")
    return value


def _check_text(field: str, value: object, *, limit: int) -> str:
    if not isinstance(value, str):
        raise InstructionError(field=field, reason="must be a string")
    if len(value) > limit:
        raise InstructionError(field=field, reason=f"longer than {limit} characters")
    if _CONTROL_RE.search(value) is not None:
        raise InstructionError(field=field, reason="contains control characters")
    return value


def _check_command(value: object) -> ExecutorCommandType:
    if isinstance(value, ExecutorCommandType):
        return value
    if isinstance(value, str) and value in ExecutorCommandType.__members__:
        return ExecutorCommandType[value]
    raise InstructionError(field="command_type", reason=f"unknown command type {value!r:.80}")


def _check_timeout(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InstructionError(field="timeout_ms", reason="must be an int")
    if not 0 < value <= MAX_TIMEOUT_MS:
        raise InstructionError(field="timeout_ms", reason=f"must be in 1..{MAX_TIMEOUT_MS}")
    return value


def _check_url(value: str) -> str:
    if value == "":
        raise InstructionError(field="target_url", reason="NAVIGATE requires a URL")
    if _WHITESPACE_RE.search(value) is not None:
        raise InstructionError(field="target_url", reason="contains whitespace")
    match = _URL_RE.fullmatch(value)
    if match is None or match["scheme"].lower() not in ("http", "https"):
        raise InstructionError(field="target_url", reason="must be an absolute http(s) URL")
    authority = match["authority"]
    if "@" in authority:
        raise InstructionError(field="target_url", reason="must not carry credentials")
    host = _HOST_RE.fullmatch(authority)
    if host is None or (host["port"] is not None and not 0 < int(host["port"]) <= 65535):
        raise InstructionError(field="target_url", reason="host (and port) are not valid")
    return value


def _check_parameters(value: object) -> dict[str, ParameterValue]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InstructionError(field="parameters", reason="must be a mapping")
    if len(value) > MAX_PARAMETERS:
        raise InstructionError(field="parameters", reason=f"more than {MAX_PARAMETERS} entries")
    checked: dict[str, ParameterValue] = {}
    for key, item in value.items():
        if (
            not isinstance(key, str)
            or len(key) > MAX_PARAMETER_KEY_CHARS
            or _PARAM_KEY_RE.fullmatch(key) is None
        ):
            raise InstructionError(field="parameters", reason=f"invalid key {key!r:.80}")
        if _normalise_key(key) in AUTHORITY_KEYS:
            raise InstructionError(field="parameters", reason=f"key {key!r} names an authority")
        if isinstance(item, bool):
            checked[key] = item
        elif isinstance(item, int):
            if abs(item) > MAX_PARAMETER_INT:
                raise InstructionError(field="parameters", reason=f"{key}: int out of range")
            checked[key] = item
        elif isinstance(item, str):
            checked[key] = _check_text("parameters", item, limit=MAX_PARAMETER_VALUE_CHARS)
        else:
            raise InstructionError(field="parameters", reason=f"{key}: must be str, int or bool")
    return checked


def build_executor_instruction(
    *,
    instruction_id: object,
    execution_id: object,
    command_type: object,
    target_url: object = "",
    target_selector: object = "",
    timestamp: object,
    timeout_ms: object,
    parameters: object = None,
) -> ExecutorInstructionEnvelope:
    """Validate request data and build an instruction envelope (raises ``InstructionError``).

    Rules: ids are 1..128 characters of ``[A-Za-z0-9._:-]`` starting alphanumeric; the command
    type is a member or a member name; ``timeout_ms`` is an int in 1..600000; NAVIGATE requires an
    absolute http/https URL with a valid host, no credentials, no whitespace or control
    characters, and takes no selector; CLICK/READ/EXTRACT require a selector (<= 1024 chars, no
    control characters) and take no URL; SCROLL/SCREENSHOT take an optional selector and no URL;
    SHUTDOWN takes neither. ``parameters`` maps safe keys (never an authority key) to str, int
    or bool.
    """
    instruction = _check_id("instruction_id", instruction_id)
    execution = _check_id("execution_id", execution_id)
    command = _check_command(command_type)
    stamp = _check_text("timestamp", timestamp, limit=MAX_TIMESTAMP_CHARS)
    if stamp == "":
        raise InstructionError(field="timestamp", reason="must be a non-empty string")
    timeout = _check_timeout(timeout_ms)
    url = _check_text("target_url", target_url, limit=MAX_URL_CHARS)
    selector = _check_text("target_selector", target_selector, limit=MAX_SELECTOR_CHARS)
    if command in _URL_COMMANDS:
        url = _check_url(url)
    elif url != "":
        raise InstructionError(field="target_url", reason=f"{command.value} takes no URL")
    if command in _SELECTOR_REQUIRED:
        if selector.strip() == "":
            raise InstructionError(
                field="target_selector", reason=f"{command.value} requires a selector"
            )
    elif command not in _SELECTOR_OPTIONAL and selector != "":
        raise InstructionError(field="target_selector", reason=f"{command.value} takes no selector")
    return ExecutorInstructionEnvelope(
        instruction_id=instruction,
        execution_id=execution,
        command_type=command,
        target_url=url,
        target_selector=selector,
        timestamp=stamp,
        timeout_ms=timeout,
        parameters=_check_parameters(parameters),
    )


def instruction_to_wire(envelope: ExecutorInstructionEnvelope) -> dict[str, object]:
    """Encode an instruction envelope as a JSON-ready dict (enum values as strings)."""
    return {
        "instruction_id": envelope.instruction_id,
        "execution_id": envelope.execution_id,
        "command_type": envelope.command_type.value,
        "target_url": envelope.target_url,
        "target_selector": envelope.target_selector,
        "timestamp": envelope.timestamp,
        "timeout_ms": envelope.timeout_ms,
        "parameters": dict(envelope.parameters),
    }


def instruction_from_wire(data: object) -> ExecutorInstructionEnvelope:
    """Decode ``instruction_to_wire`` output (e.g. in an executor), re-validating every rule."""
    if not isinstance(data, Mapping):
        raise InstructionError(field="instruction", reason="must be a JSON object")
    return build_executor_instruction(
        instruction_id=data.get("instruction_id"),
        execution_id=data.get("execution_id"),
        command_type=data.get("command_type"),
        target_url=data.get("target_url", ""),
        target_selector=data.get("target_selector", ""),
        timestamp=data.get("timestamp"),
        timeout_ms=data.get("timeout_ms"),
        parameters=data.get("parameters"),
    )


# --------------------------------------------------------------------------- responses
def response_to_wire(envelope: ExecutorResponseEnvelope) -> dict[str, object]:
    """Encode a response envelope as the wire dict an executor sends."""
    return {
        "instruction_id": envelope.instruction_id,
        "response_type": envelope.response_type.value,
        "evidence_hash": envelope.evidence_hash,
        "error_message": envelope.error_message,
        "timestamp": envelope.timestamp,
        "output": deep_thaw(envelope.output),
        "partial": envelope.partial,
    } | ({} if envelope.retry_after_ms is None else {"retry_after_ms": envelope.retry_after_ms})


@lru_cache(maxsize=4096)  # bounded: keys come from untrusted executors
def _normalise_key(key: str) -> str:
    """``maxRetries``, ``Max-Retries`` and ``max retries`` all become ``max_retries``."""
    snake = _CAMEL_RE.sub("_", key.strip())
    return snake.lower().replace("-", "_").replace(" ", "_")


def _deny(code: str, description: str) -> ExecutionSafetyResult:
    return ExecutionSafetyResult(
        is_safe=False, reason_code=code, reason_description=description, response=None
    )


def _scan(
    response: Mapping[object, object], instruction: ExecutorInstructionEnvelope
) -> ExecutionSafetyResult | None:
    """Walk the whole response once (iteratively, bounded) looking for structure and authority."""
    own_ids = {
        "instruction_id": instruction.instruction_id,
        "execution_id": instruction.execution_id,
    }
    stack: list[tuple[object, int, bool]] = [(response, 1, True)]
    nodes = 0
    claim: str | None = None
    while stack:
        node, depth, top = stack.pop()
        nodes += 1
        if nodes > MAX_RESPONSE_NODES:
            return _deny(rc.RESPONSE_TOO_LARGE, f"more than {MAX_RESPONSE_NODES} values")
        if depth > MAX_RESPONSE_DEPTH:
            return _deny(rc.RESPONSE_TOO_LARGE, f"nested deeper than {MAX_RESPONSE_DEPTH}")
        if isinstance(node, str):
            if len(node) > MAX_RESPONSE_STRING_CHARS:
                return _deny(rc.RESPONSE_TOO_LARGE, "a string is too long")
        elif isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str):
                    return _deny(rc.RESPONSE_MALFORMED, f"non-string key {key!r:.80}")
                name = _normalise_key(key)
                if claim is None and name in AUTHORITY_KEYS:
                    claim = f"field {key!r:.80} tries to set supervisor state"
                if claim is None and not top and name in _IDENTITY_KEYS and value != own_ids[name]:
                    claim = f"field {key!r:.80} reports a result for another {name[:-3]}"
                stack.append((value, depth + 1, False))
        elif isinstance(node, list | tuple):
            stack.extend((item, depth + 1, False) for item in node)
        elif not (node is None or isinstance(node, bool | int | float)):
            return _deny(rc.RESPONSE_MALFORMED, f"value of type {type(node).__name__}")
    if claim is not None:
        return _deny(rc.RESPONSE_CLAIMS_AUTHORITY, claim)
    return None


def _optional_str(response: Mapping[str, object], key: str) -> str | None:
    value = response.get(key, "")
    if value is None:
        value = ""
    return value if isinstance(value, str) else None


def validate_executor_response(instruction: object, response: object) -> ExecutionSafetyResult:
    """Apply the Phase-20 safety rules to an untrusted response (never raises).

    ``response`` is the decoded JSON object (or an ``ExecutorResponseEnvelope``). See the module
    docstring for the order of checks; each DENIED rule has its own reason code. An object that
    breaks while being inspected (a hostile mapping whose methods raise) is RESPONSE_MALFORMED.
    """
    try:
        return _validate(instruction, response)
    except Exception as exc:  # never raise on hostile input: deny it
        return _deny(
            rc.RESPONSE_MALFORMED, f"response could not be inspected: {type(exc).__name__}"
        )


def _validate(instruction: object, response: object) -> ExecutionSafetyResult:
    if not isinstance(instruction, ExecutorInstructionEnvelope):
        return _deny(rc.INSTRUCTION_INVALID, f"instruction is a {type(instruction).__name__}")
    if isinstance(response, ExecutorResponseEnvelope):
        response = response_to_wire(response)
    if not isinstance(response, Mapping):
        return _deny(rc.RESPONSE_MALFORMED, f"response is a {type(response).__name__}")
    denial = _scan(response, instruction)
    if denial is not None:
        return denial
    fields: Mapping[str, object] = response  # every key is a str: checked by the scan
    unknown = sorted(set(fields) - _RESPONSE_FIELDS)
    if unknown:
        return _deny(rc.RESPONSE_UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)[:200]}")
    instruction_id = fields.get("instruction_id")
    if instruction_id is None or instruction_id == "":
        return _deny(rc.RESPONSE_MISSING_INSTRUCTION_ID, "instruction_id is missing")
    if not isinstance(instruction_id, str):
        return _deny(rc.RESPONSE_FIELD_TYPE_INVALID, "instruction_id must be a string")
    if instruction_id != instruction.instruction_id:
        return _deny(
            rc.RESPONSE_INSTRUCTION_ID_MISMATCH,
            f"response is for {instruction_id[:MAX_ID_CHARS]!r}, "
            f"expected {instruction.instruction_id!r}",
        )
    raw_type = fields.get("response_type")
    if raw_type is None:
        return _deny(rc.RESPONSE_TYPE_UNKNOWN, "response_type is missing")
    if not isinstance(raw_type, str):
        return _deny(rc.RESPONSE_FIELD_TYPE_INVALID, "response_type must be a string")
    if raw_type not in ExecutorResponseType.__members__:
        return _deny(rc.RESPONSE_TYPE_UNKNOWN, f"unknown response_type {raw_type[:80]!r}")
    response_type = ExecutorResponseType[raw_type]
    evidence_hash = _optional_str(fields, "evidence_hash")
    error_message = _optional_str(fields, "error_message")
    timestamp = _optional_str(fields, "timestamp")
    output = fields.get("output", {})
    partial = fields.get("partial", False)
    if evidence_hash is None or error_message is None or timestamp is None:
        return _deny(
            rc.RESPONSE_FIELD_TYPE_INVALID,
            "evidence_hash, error_message and timestamp must be strings",
        )
    if not isinstance(output, Mapping):
        return _deny(rc.RESPONSE_FIELD_TYPE_INVALID, "output must be a JSON object")
    if not isinstance(partial, bool):
        return _deny(rc.RESPONSE_FIELD_TYPE_INVALID, "partial must be a boolean")
    retry_after_ms = fields.get("retry_after_ms")
    if retry_after_ms is not None and (
        type(retry_after_ms) is not int or not 0 <= retry_after_ms <= MAX_RETRY_AFTER_MS
    ):
        return _deny(
            rc.RESPONSE_FIELD_TYPE_INVALID,
            f"retry_after_ms must be an integer in 0..{MAX_RETRY_AFTER_MS} or null",
        )
    if evidence_hash != "" and _EVIDENCE_RE.fullmatch(evidence_hash) is None:
        return _deny(
            rc.RESPONSE_EVIDENCE_HASH_INVALID, "evidence_hash must be 64 lowercase hex digits"
        )
    if response_type is ExecutorResponseType.SUCCESS and evidence_hash == "":
        return _deny(rc.SUCCESS_WITHOUT_EVIDENCE, "SUCCESS without evidence_hash")
    envelope = ExecutorResponseEnvelope(
        instruction_id=instruction_id,
        response_type=response_type,
        evidence_hash=evidence_hash,
        error_message=error_message,
        timestamp=timestamp,
        output=output,
        partial=partial,
        retry_after_ms=retry_after_ms,
    )
    code = rc.RESPONSE_ACCEPTED_PARTIAL if partial else rc.RESPONSE_ACCEPTED
    return ExecutionSafetyResult(
        is_safe=True,
        reason_code=code,
        reason_description=f"{response_type.value} response accepted"
        + (" (partial output)" if partial else ""),
        response=envelope,
    )


def enforce_executor_safety(instruction: object, response: object) -> bool:
    """True only when ``validate_executor_response`` finds the response safe (``is_safe``)."""
    return validate_executor_response(instruction, response).is_safe
