// A reference executor for the hunter daemon, written from docs/protocol.md alone.
//
// It connects to the daemon's executors.sock, says hello, keeps the heartbeats going both
// ways, answers READ instructions with evidence bytes and their sha256, honours cancel, and
// reconnects with backoff whenever the connection is lost. Node's standard library only.
//
// Every notable event is one JSON line on stdout ({"event": ..., ...}), so tools and tests
// can follow it; problems go to stderr.
//
// READ here reads no real page: the text "read" is the instruction's `text` parameter, or
// "text of <target_selector>". The integer parameter `sleep_ms` makes it work that long
// first (cancellable), to show what a cancel does.

import { createHash } from "node:crypto";
import { connect, type Socket } from "node:net";

// ---------------------------------------------------------------------------- protocol

/** docs/protocol.md, 3.1: the version this executor speaks. */
const PROTOCOL_VERSION = 1;
/** docs/protocol.md, 3.5: the largest evidence the daemon keeps (decoded bytes). */
const MAX_EVIDENCE_BYTES = 512 * 1024;
/** The largest frame we accept from the daemon (its own frames are small). */
const MAX_INCOMING_FRAME = 16 * 1024 * 1024;
/** docs/protocol.md, 9: reconnect backoff, 50 ms x 2^n, capped, +-10 % jitter. */
const BACKOFF_BASE_MS = 50;

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

interface Welcome {
  heartbeatIntervalMs: number;
  heartbeatMisses: number;
  maxFrameBytes: number;
}

interface Instruction {
  instructionId: string;
  executionId: string;
  commandType: string;
  targetSelector: string;
  parameters: { [key: string]: string | number | boolean };
}

type ResponseType = "SUCCESS" | "FAILURE" | "TIMEOUT" | "ERROR" | "REFUSED";

interface Answer {
  responseType: ResponseType;
  errorMessage?: string;
  output?: JsonObject;
  evidence?: Buffer;
}

/** One frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON (an object). */
function encodeFrame(message: JsonObject): Buffer {
  const body = Buffer.from(JSON.stringify(message), "utf8");
  const header = Buffer.alloc(4);
  header.writeUInt32BE(body.length, 0);
  return Buffer.concat([header, body]);
}

/** Reassembles frames from a byte stream, by the length prefix only (docs/protocol.md, 2). */
class FrameReader {
  private buffer: Buffer = Buffer.alloc(0);

  /** The complete frames' bodies now available, parsed; throws on a malformed frame. */
  push(chunk: Buffer): JsonObject[] {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    const frames: JsonObject[] = [];
    while (this.buffer.length >= 4) {
      const length = this.buffer.readUInt32BE(0);
      if (length < 2 || length > MAX_INCOMING_FRAME) {
        throw new Error(`bad frame length ${length}`);
      }
      if (this.buffer.length < 4 + length) break;
      const body = this.buffer.subarray(4, 4 + length).toString("utf8");
      this.buffer = this.buffer.subarray(4 + length);
      const parsed: unknown = JSON.parse(body);
      if (!isObject(parsed)) throw new Error("frame body is not a JSON object");
      frames.push(parsed);
    }
    return frames;
  }
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function str(obj: JsonObject, key: string): string {
  const value = obj[key];
  return typeof value === "string" ? value : "";
}

function int(obj: JsonObject, key: string, fallback: number): number {
  const value = obj[key];
  return typeof value === "number" && Number.isInteger(value) ? value : fallback;
}

function parseWelcome(frame: JsonObject): Welcome {
  return {
    heartbeatIntervalMs: Math.max(1, int(frame, "heartbeat_interval_ms", 5000)),
    heartbeatMisses: Math.max(1, int(frame, "heartbeat_misses", 3)),
    maxFrameBytes: Math.max(2, int(frame, "max_frame_bytes", 1024 * 1024)),
  };
}

function parseInstruction(frame: JsonObject): Instruction | null {
  const envelope = frame["instruction"];
  if (!isObject(envelope)) return null;
  const instructionId = str(envelope, "instruction_id");
  if (instructionId === "") return null;
  const parameters: Instruction["parameters"] = {};
  const raw = envelope["parameters"];
  if (isObject(raw)) {
    for (const [key, value] of Object.entries(raw)) {
      if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") {
        parameters[key] = value;
      }
    }
  }
  return {
    instructionId,
    executionId: str(envelope, "execution_id"),
    commandType: str(envelope, "command_type"),
    targetSelector: str(envelope, "target_selector"),
    parameters,
  };
}

// ---------------------------------------------------------------------------- output

function emit(event: string, fields: JsonObject = {}): void {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

function warn(message: string): void {
  process.stderr.write(`ts-executor: ${message}\n`);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

// ---------------------------------------------------------------------------- commands

class Cancelled extends Error {
  constructor(readonly reason: string) {
    super(`cancelled by the daemon (${reason})`);
  }
}

/** READ: the text read is the evidence (docs/protocol.md 3.5: "the evidence of a READ is the
 * text read"). */
async function read(instruction: Instruction, signal: AbortSignal): Promise<Answer> {
  const sleepMs = instruction.parameters["sleep_ms"];
  if (typeof sleepMs === "number" && sleepMs > 0) {
    await sleep(sleepMs, signal);
  }
  const given = instruction.parameters["text"];
  const text = typeof given === "string" ? given : `text of ${instruction.targetSelector}`;
  return {
    responseType: "SUCCESS",
    output: { text },
    evidence: Buffer.from(text, "utf8"),
  };
}

const HANDLERS: { [command: string]: (i: Instruction, s: AbortSignal) => Promise<Answer> } = {
  READ: read,
};

// ---------------------------------------------------------------------------- one connection

interface Options {
  socketPath: string;
  executorId: string;
  slots: number;
  maxBackoffMs: number;
}

/** How a connection ended: reconnect (after `delayMs`, or the backoff when null) or stop. */
type Ending =
  | { kind: "reconnect"; delayMs: number | null; welcomed: boolean; reason: string }
  | { kind: "stop"; code: number };

class Connection {
  private readonly reader = new FrameReader();
  private welcome: Welcome | null = null;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private lastHeard = Date.now();
  private readonly running = new Map<string, AbortController>();
  private ending: Ending | null = null;
  private resolveEnded: ((ending: Ending) => void) | null = null;

  constructor(
    private readonly options: Options,
    private readonly socket: Socket,
  ) {}

  /** Runs the connection until it is lost, rejected or stopped. */
  run(): Promise<Ending> {
    const ended = new Promise<Ending>((resolve) => {
      this.resolveEnded = resolve;
    });
    this.socket.on("data", (chunk: Buffer) => this.onData(chunk));
    this.socket.on("error", (error: Error) => this.finish(lost(`socket error: ${error.message}`, this.welcome !== null)));
    this.socket.on("close", () => this.finish(lost("connection closed by the daemon", this.welcome !== null)));
    this.send({
      type: "hello",
      executor_id: this.options.executorId,
      protocol_version: PROTOCOL_VERSION,
      commands: Object.keys(HANDLERS),
      slots: this.options.slots,
      software: "hunter-ts-executor/1.0.0",
    });
    return ended;
  }

  /** Stops this connection from outside (a signal): close it, end with `ending`. */
  stop(ending: Ending): void {
    this.finish(ending);
  }

  private send(message: JsonObject): void {
    if (this.ending === null && !this.socket.destroyed) this.socket.write(encodeFrame(message));
  }

  private finish(ending: Ending): void {
    if (this.ending !== null) return;
    this.ending = ending;
    if (this.heartbeatTimer !== null) clearInterval(this.heartbeatTimer);
    // In-flight work is gone with the connection: the daemon has already ended it.
    for (const controller of this.running.values()) controller.abort(new Cancelled("connection lost"));
    this.running.clear();
    this.socket.destroy();
    this.resolveEnded?.(ending);
  }

  private onData(chunk: Buffer): void {
    this.lastHeard = Date.now();
    let frames: JsonObject[];
    try {
      frames = this.reader.push(chunk);
    } catch (error) {
      this.finish(lost(`bad frame from the daemon: ${String(error)}`, this.welcome !== null));
      return;
    }
    for (const frame of frames) {
      if (this.ending !== null) return;
      this.onFrame(frame);
    }
  }

  private onFrame(frame: JsonObject): void {
    const type = frame["type"];
    if (this.welcome === null) {
      this.onFirstFrame(frame);
      return;
    }
    switch (type) {
      case "heartbeat":
        return; // any frame is a sign of life; lastHeard is already updated
      case "instruction":
        this.onInstruction(frame);
        return;
      case "cancel":
        this.onCancel(frame);
        return;
      default:
        // docs/protocol.md, 8: unknown message types from the daemon are ignored.
        return;
    }
  }

  private onFirstFrame(frame: JsonObject): void {
    const type = frame["type"];
    if (type === "welcome") {
      const welcome = parseWelcome(frame);
      this.welcome = welcome;
      emit("welcome", {
        executor_id: str(frame, "executor_id"),
        heartbeat_interval_ms: welcome.heartbeatIntervalMs,
        heartbeat_misses: welcome.heartbeatMisses,
        max_frame_bytes: welcome.maxFrameBytes,
      });
      this.heartbeatTimer = setInterval(() => this.tick(), welcome.heartbeatIntervalMs);
      return;
    }
    if (type === "reject") {
      const code = str(frame, "reason_code");
      const retryAfter = frame["retry_after_ms"];
      emit("rejected", { reason_code: code, reason: str(frame, "reason"), retry_after_ms: retryAfter ?? null });
      // docs/protocol.md, 3.3: these three cannot be fixed by retrying.
      if (code === "UNSUPPORTED_VERSION" || code === "BAD_HELLO" || code === "UID_NOT_ALLOWED") {
        warn(`rejected: ${code}: ${str(frame, "reason")}`);
        this.finish({ kind: "stop", code: 3 });
      } else {
        const delayMs = typeof retryAfter === "number" ? retryAfter : null;
        this.finish({ kind: "reconnect", delayMs, welcomed: false, reason: `rejected: ${code}` });
      }
      return;
    }
    // Not an executor socket (the control socket answers a hello with an error object).
    warn(`the first frame is neither welcome nor reject: is ${this.options.socketPath} the daemon's executors.sock?`);
    this.finish({ kind: "stop", code: 4 });
  }

  /** Every heartbeat interval: send a heartbeat; give up after interval x misses of silence. */
  private tick(): void {
    const welcome = this.welcome;
    if (welcome === null) return;
    const silentMs = Date.now() - this.lastHeard;
    if (silentMs > welcome.heartbeatIntervalMs * welcome.heartbeatMisses) {
      this.finish(lost(`nothing from the daemon for ${silentMs} ms`, true));
      return;
    }
    this.send({ type: "heartbeat", ts_us: Date.now() * 1000 });
  }

  private onInstruction(frame: JsonObject): void {
    const instruction = parseInstruction(frame);
    if (instruction === null) {
      warn("an instruction without an instruction_id: ignored");
      return;
    }
    const controller = new AbortController();
    this.running.set(instruction.instructionId, controller);
    emit("instruction", {
      instruction_id: instruction.instructionId,
      execution_id: instruction.executionId,
      command_type: instruction.commandType,
    });
    void this.execute(instruction, controller.signal).then((answer) => {
      if (this.running.get(instruction.instructionId) !== controller) return; // connection gone
      this.running.delete(instruction.instructionId);
      this.respond(instruction, answer);
    });
  }

  private async execute(instruction: Instruction, signal: AbortSignal): Promise<Answer> {
    const handler = HANDLERS[instruction.commandType];
    if (handler === undefined) {
      return { responseType: "REFUSED", errorMessage: `${instruction.commandType} is not supported` };
    }
    try {
      return await handler(instruction, signal);
    } catch (error) {
      if (error instanceof Cancelled) {
        // docs/protocol.md, 3.6: still answer, conventionally TIMEOUT.
        return { responseType: "TIMEOUT", errorMessage: "cancelled by the daemon" };
      }
      return { responseType: "ERROR", errorMessage: String(error) };
    }
  }

  private onCancel(frame: JsonObject): void {
    const instructionId = str(frame, "instruction_id");
    const reason = str(frame, "reason");
    const controller = this.running.get(instructionId);
    emit("cancel", { instruction_id: instructionId, reason, known: controller !== undefined });
    // A cancel for an instruction we do not know (already answered) is ignored.
    controller?.abort(new Cancelled(reason));
  }

  private respond(instruction: Instruction, answer: Answer): void {
    const success = answer.responseType === "SUCCESS";
    const evidence = success ? (answer.evidence ?? Buffer.alloc(0)) : null;
    const response: JsonObject = {
      instruction_id: instruction.instructionId,
      response_type: answer.responseType,
      // SUCCESS needs the sha256 of its evidence, lowercase hex; "" otherwise.
      evidence_hash: evidence === null ? "" : createHash("sha256").update(evidence).digest("hex"),
      error_message: answer.errorMessage ?? "",
      timestamp: new Date().toISOString(),
      output: answer.output ?? {},
      partial: false,
    };
    let message: JsonObject = { type: "response", response };
    let attached = false;
    if (evidence !== null && evidence.length > 0 && evidence.length <= MAX_EVIDENCE_BYTES) {
      const withBytes: JsonObject = { ...message, evidence: evidence.toString("base64") };
      // A frame over the daemon's limit would cost the connection: send the hash alone then.
      if (Buffer.byteLength(JSON.stringify(withBytes), "utf8") <= (this.welcome?.maxFrameBytes ?? 0)) {
        message = withBytes;
        attached = true;
      }
    }
    this.send(message);
    emit("response", {
      instruction_id: instruction.instructionId,
      response_type: answer.responseType,
      evidence_hash: str(response, "evidence_hash"),
      evidence_attached: attached,
    });
  }
}

function lost(reason: string, welcomed: boolean): Ending {
  return { kind: "reconnect", delayMs: null, welcomed, reason };
}

// ---------------------------------------------------------------------------- reconnecting

function openSocket(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    const onError = (error: Error): void => {
      socket.destroy();
      reject(error);
    };
    socket.once("error", onError);
    socket.once("connect", () => {
      socket.off("error", onError);
      resolve(socket);
    });
  });
}

function backoffMs(failures: number, capMs: number): number {
  const base = Math.min(capMs, BACKOFF_BASE_MS * 2 ** Math.min(failures, 30));
  return Math.round(base * (0.9 + Math.random() * 0.2));
}

async function main(): Promise<number> {
  const options = parseArgs(process.argv.slice(2));
  if (typeof options === "string") {
    warn(options);
    return 2;
  }
  let current: Connection | null = null;
  let stopping = false;
  const wake = new AbortController();
  const onSignal = (): void => {
    stopping = true;
    current?.stop({ kind: "stop", code: 0 });
    wake.abort();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);

  let failures = 0;
  let unreachableSince: number | null = null;
  while (!stopping) {
    let delayMs: number | null = null;
    try {
      const socket = await openSocket(options.socketPath);
      if (unreachableSince !== null) unreachableSince = null;
      emit("connected", { socket: options.socketPath });
      current = new Connection(options, socket);
      const ending = await current.run();
      current = null;
      if (ending.kind === "stop") return ending.code;
      if (ending.welcomed) failures = 0; // a connection that worked restarts the backoff
      delayMs = ending.delayMs;
      emit("disconnected", { reason: ending.reason });
    } catch (error) {
      if (unreachableSince === null) {
        unreachableSince = Date.now();
        warn(`cannot reach ${options.socketPath} (${String(error)}); retrying`);
      }
    }
    if (stopping) break;
    const wait = delayMs ?? backoffMs(failures, options.maxBackoffMs);
    failures += 1;
    emit("reconnecting", { in_ms: wait });
    try {
      await sleep(wait, wake.signal);
    } catch {
      break; // stopped while waiting
    }
  }
  return 0;
}

function parseArgs(argv: string[]): Options | string {
  const options: Options = {
    socketPath: process.env["HUNTER_EXECUTOR_SOCKET"] ?? "",
    executorId: process.env["HUNTER_EXECUTOR_ID"] ?? "ts-reader-1",
    slots: 2,
    maxBackoffMs: 5000,
  };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === "--help" || flag === "-h") {
      return "usage: node dist/executor.js --socket PATH [--id ID] [--slots N] [--max-backoff-ms MS]";
    }
    if (value === undefined) return `${flag} needs a value`;
    i += 1;
    if (flag === "--socket") options.socketPath = value;
    else if (flag === "--id") options.executorId = value;
    else if (flag === "--slots") options.slots = Number(value);
    else if (flag === "--max-backoff-ms") options.maxBackoffMs = Number(value);
    else return `unknown argument ${flag}`;
  }
  if (options.socketPath === "") return "no socket: pass --socket PATH or set HUNTER_EXECUTOR_SOCKET";
  if (!/^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/.test(options.executorId)) {
    return `bad executor id ${JSON.stringify(options.executorId)}: 1-128 chars of [A-Za-z0-9._:@-]`;
  }
  if (!Number.isInteger(options.slots) || options.slots < 1 || options.slots > 1024) {
    return "--slots must be an integer in 1..1024";
  }
  if (!Number.isFinite(options.maxBackoffMs) || options.maxBackoffMs < 1) {
    return "--max-backoff-ms must be a positive number";
  }
  return options;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    warn(`fatal: ${String(error)}`);
    process.exit(1);
  },
);
