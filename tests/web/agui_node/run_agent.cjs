// Runs turns of one thread through @ag-ui/client's HttpAgent and prints, as JSON, what
// the client assembled and what came over the wire.
//
// argv[2]: a file of {"url", "key", "threadId", "turns": [{"runId", "text", "forwardedProps"?}]}
// stdout: {"turns": [{"runId", "events", "wire", "newMessages", "error"}],
//          "messages", "warnings", "schemaProblems"}
//
// AGUI_MODULES names the node_modules directory of the cached install.
"use strict";

const { createRequire } = require("node:module");
const path = require("node:path");

const load = createRequire(path.join(process.env.AGUI_MODULES, "noop.js"));
const { HttpAgent } = load("@ag-ui/client");
const { EventSchema } = load("@ag-ui/core/schemas");

const warnings = [];
for (const level of ["warn", "error"]) {
  console[level] = (...args) =>
    warnings.push(args.map((a) => (a instanceof Error ? a.message : String(a))).join(" "));
}

// Every key of `original` (recursively) is still in `parsed`: the schema stripped nothing.
function stripped(original, parsed, where, out) {
  if (original === null || typeof original !== "object") return out;
  for (const [key, value] of Object.entries(original)) {
    const at = `${where}.${key}`;
    if (parsed === null || typeof parsed !== "object" || !(key in parsed)) out.push(at);
    else stripped(value, parsed[key], at, out);
  }
  return out;
}

// The response's bytes as SSE frames (id and data), read from a tee of the body.
function recordFrames(body, frames) {
  const decoder = new TextDecoder();
  let buffer = "";
  const reader = body.getReader();
  const take = (text) => {
    const fields = { id: null, data: [] };
    for (const line of text.split("\n")) {
      if (line.startsWith("data:")) fields.data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("id:")) fields.id = line.slice(3).replace(/^ /, "");
    }
    if (fields.data.length) frames.push({ id: fields.id, data: JSON.parse(fields.data.join("\n")) });
  };
  return (async () => {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const parts = buffer.split("\n\n");
      buffer = parts.pop();
      parts.forEach(take);
    }
    if (buffer) take(buffer);
  })();
}

async function main() {
  const request = JSON.parse(require("node:fs").readFileSync(process.argv[2], "utf8"));
  let frames = [];
  let recording = Promise.resolve();
  const agent = new HttpAgent({
    url: request.url,
    headers: request.key ? { Authorization: `Bearer ${request.key}` } : {},
    threadId: request.threadId,
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      if (!response.body) return response;
      const [mine, theirs] = response.body.tee();
      recording = recordFrames(mine, frames);
      return new Response(theirs, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      });
    },
  });
  const schemaProblems = [];
  const turns = [];
  for (const turn of request.turns) {
    frames = [];
    const events = [];
    agent.addMessage({ id: `${turn.runId}/user`, role: "user", content: turn.text });
    let newMessages = null;
    let error = null;
    try {
      const result = await agent.runAgent(
        { runId: turn.runId, forwardedProps: turn.forwardedProps ?? {} },
        { onEvent: ({ event }) => void events.push(event) },
      );
      newMessages = result.newMessages;
    } catch (exc) {
      error = { message: String(exc.message ?? exc), status: exc.status ?? null };
    }
    await recording.catch(() => undefined);
    for (const frame of frames) {
      const parsed = EventSchema.safeParse(frame.data);
      if (!parsed.success) {
        schemaProblems.push({ id: frame.id, problem: parsed.error.message });
      } else {
        const lost = stripped(frame.data, parsed.data, "", []);
        if (lost.length) schemaProblems.push({ id: frame.id, problem: `stripped ${lost}` });
      }
    }
    turns.push({ runId: turn.runId, events, wire: frames, newMessages, error });
  }
  process.stdout.write(
    JSON.stringify({ turns, messages: agent.messages, warnings, schemaProblems }),
  );
}

main().catch((exc) => {
  process.stderr.write(String(exc && exc.stack ? exc.stack : exc));
  process.exit(1);
});
