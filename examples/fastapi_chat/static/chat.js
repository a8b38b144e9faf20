// Send a message, then follow its reply: each event a line of the conversation,
// each assistant message's text growing as its deltas arrive.
const conversation = document.getElementById("conversation");
const form = document.getElementById("ask");
const status = document.getElementById("status");

function line(className, text) {
  const item = document.createElement("li");
  item.className = className;
  item.textContent = text;
  conversation.appendChild(item);
  return item;
}

function follow(runId) {
  const messages = new Map();
  const stream = new EventSource(`/messages/${encodeURIComponent(runId)}/events`);
  status.textContent = "replying";
  stream.onmessage = (event) => {
    const chunk = JSON.parse(event.data);
    const item = line("event", chunk.type);
    item.dataset.seq = event.lastEventId;
    item.dataset.type = chunk.type;
    item.dataset.run = runId;
    if (chunk.type === "TEXT_MESSAGE_START") {
      messages.set(chunk.messageId, line("assistant", ""));
    } else if (chunk.type === "TEXT_MESSAGE_CONTENT") {
      messages.get(chunk.messageId).textContent += chunk.delta;
    }
  };
  stream.addEventListener("end", () => {
    stream.close();
    conversation.dataset.replies = Number(conversation.dataset.replies || 0) + 1;
    status.textContent = "done";
    form.querySelector("button").disabled = false;
  });
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("prompt");
  form.querySelector("button").disabled = true;
  line("user", input.value);
  const response = await fetch("/messages", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: input.value }),
  });
  input.value = "";
  if (!response.ok) {
    status.textContent = `refused: ${response.status}`;
    form.querySelector("button").disabled = false;
    return;
  }
  follow((await response.json()).run_id);
});
