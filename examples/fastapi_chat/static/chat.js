// The conversation, built from each reply's AG-UI events: the user's messages, the
// agent's text (one item per message id, its deltas joined as they stream) and its tool
// calls (name, arguments, result). Everything is set as text, never parsed as HTML.
const conversation = document.getElementById("conversation");
const form = document.getElementById("ask");
const input = document.getElementById("prompt");
const button = form.querySelector("button");
const status = document.getElementById("status");

function add(parent, tag, className, text = "") {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  parent.appendChild(node);
  return node;
}

// One reply: the items its events make, in the order they arrive.
function reply(runId) {
  const messages = new Map();  // messageId -> its item
  const tools = new Map();  // toolCallId -> {item, args, result}
  const item = (className, text) => {
    const node = add(conversation, "li", className, text);
    node.dataset.run = runId;
    return node;
  };
  const message = (id) => {
    if (!messages.has(id)) messages.set(id, item("assistant", ""));
    return messages.get(id);
  };
  const tool = (id, name = "") => {
    if (!tools.has(id)) {
      const node = item("tool", "");
      add(node, "span", "tool-name", name);
      tools.set(id, {
        node,
        args: add(node, "code", "tool-args"),
        result: add(node, "pre", "tool-result"),
      });
    }
    return tools.get(id);
  };
  return {
    item,
    apply(chunk) {
      switch (chunk.type) {
        case "TEXT_MESSAGE_START":
          message(chunk.messageId);
          break;
        case "TEXT_MESSAGE_CONTENT":
          message(chunk.messageId).textContent += chunk.delta;
          break;
        case "TOOL_CALL_START":
          tool(chunk.toolCallId, chunk.toolCallName);
          break;
        case "TOOL_CALL_ARGS":
          tool(chunk.toolCallId).args.textContent += chunk.delta;
          break;
        case "TOOL_CALL_RESULT": {
          const call = tool(chunk.toolCallId);
          call.result.textContent = chunk.content;
          if (chunk.metadata && chunk.metadata.isError) call.node.classList.add("failed");
          break;
        }
        case "RUN_ERROR":
          item("error", `error: ${chunk.message}`);
          break;
        case "CUSTOM":
          if (chunk.name === "turnkeeper.interrupted") {
            item("note", "the agent's process was lost; it goes on in a new one");
          }
          break;
        default:  // the run's start and end, usage, ...: nothing to show
      }
    },
  };
}

function settled(text) {
  status.textContent = text;
  conversation.dataset.replies = Number(conversation.dataset.replies || 0) + 1;
  button.disabled = false;
  input.focus();
}

function follow(runId) {
  const shown = reply(runId);
  let lastSeq = 0;
  const stream = new EventSource(`/messages/${encodeURIComponent(runId)}/events`);
  status.textContent = "replying";
  stream.onmessage = (event) => {
    // A reconnect resumes after the last id it saw (Last-Event-ID): each event comes once.
    const seq = Number(event.lastEventId);
    if (seq <= lastSeq) return;
    lastSeq = seq;
    shown.apply(JSON.parse(event.data));
  };
  stream.addEventListener("end", () => {
    stream.close();
    settled("done");
  });
  stream.addEventListener("log-error", (event) => {
    stream.close();
    shown.item("error", `the reply is lost: ${JSON.parse(event.data).message}`);
    settled("failed");
  });
  stream.onerror = () => {
    // EventSource reconnects by itself after a drop; it gives up on a refusal (404, 401).
    if (stream.readyState === EventSource.CLOSED) settled("the reply cannot be shown");
  };
}

// The page picks each message's id: sent again after a network error, it is the same run.
async function post(body) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch("/messages", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
    } catch (error) {
      if (attempt === 3) throw error;
    }
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const prompt = input.value;
  button.disabled = true;
  input.value = "";
  const asked = add(conversation, "li", "user", prompt);
  let response;
  try {
    response = await post({ prompt, id: crypto.randomUUID() });
  } catch (error) {
    settled(`not sent: ${error.message}`);
    return;
  }
  if (!response.ok) {
    const refusal = await response.json().catch(() => ({}));
    const reason = typeof refusal.detail === "string" ? refusal.detail : response.statusText;
    settled(`not sent: ${response.status} ${reason}`);
    return;
  }
  const { run_id: runId } = await response.json();
  asked.dataset.run = runId;
  follow(runId);
});
