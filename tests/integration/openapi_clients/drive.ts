// Drives one run end to end through a client generated from the API's OpenAPI document
// (openapi-typescript types, openapi-fetch calls), under Node as a platform's backend would:
// create a run that asks for a permission, follow its event stream, allow the request,
// send a second turn, end the run. Prints what it saw as one JSON line.
//
//   node drive.js BASE_URL API_KEY DEMO_EXECUTABLE
import createClient from "openapi-fetch";
import type { components, paths } from "./api.js";

type Event = components["schemas"]["Event"];

declare const process: { argv: string[]; exit(code: number): never }; // Node's, without @types/node

const [baseUrl, key, demo] = process.argv.slice(2);
const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${key}` } });

function fail(what: string, error: unknown): never {
  throw new Error(`${what}: ${JSON.stringify(error)}`);
}

/** The SSE messages of a stream, each as the Event it carries. */
async function* events(stream: ReadableStream<Uint8Array>): AsyncGenerator<Event> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of stream) {
    buffer += decoder.decode(chunk, { stream: true });
    const blocks = buffer.split("\n\n");
    buffer = blocks.pop() ?? "";
    for (const block of blocks) {
      const fields: Record<string, string> = {};
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const at = line.indexOf(": ");
        const name = line.slice(0, at);
        fields[name] = name in fields ? `${fields[name]}\n${line.slice(at + 2)}` : line.slice(at + 2);
      }
      if (fields.id) {
        yield { id: fields.id, type: fields.event, data: JSON.parse(fields.data), ts: 0 } as Event;
      }
    }
  }
}

async function main(): Promise<void> {
  const created = await client.POST("/v1/runs", {
    body: { harness: "stdio-json", input: "@ask touch from-typescript.txt", executable: demo, posture: "ask" },
  });
  if (!created.data) fail("createRun", created.error);
  const runId = created.data.run_id;
  const path = { run_id: runId };

  const opened = await client.GET("/v1/runs/{run_id}/events/stream", { params: { path }, parseAs: "stream" });
  if (!opened.data) fail("streamEvents", opened.error);
  const seen: string[] = [];
  let answeredBy = "";
  let ended = "";
  for await (const event of events(opened.data)) {
    seen.push(`${event.id} ${event.type}`);
    if (event.type === "permission-request") {
      const pending = await client.GET("/v1/runs/{run_id}/permissions", { params: { path } });
      if (!pending.data) fail("listPermissions", pending.error);
      if (pending.data[0]?.request_id !== event.data.request_id) fail("pending", pending.data);
      const answer = await client.POST("/v1/runs/{run_id}/permissions/{request_id}", {
        params: { path: { run_id: runId, request_id: event.data.request_id } },
        body: { decision: "allow" },
      });
      if (!answer.data) fail("answerPermission", answer.error);
      answeredBy = answer.data.by;
    } else if (event.type === "turn-complete" && event.id.startsWith("1-")) {
      const turn = await client.POST("/v1/runs/{run_id}/turns", {
        params: { path },
        body: { input: "@complete second from typescript" },
      });
      if (!turn.data) fail("submitTurn", turn.error);
    } else if (event.type === "turn-complete") {
      const end = await client.DELETE("/v1/runs/{run_id}", { params: { path, query: { wait: 30 } } });
      if (!end.data) fail("endRun", end.error);
      ended = end.data.status;
    } else if (event.type === "session-error") {
      fail("session-error", event.data);
    }
  }
  const listed = await client.GET("/v1/runs/{run_id}/events", { params: { path } });
  if (!listed.data) fail("listEvents", listed.error);
  const answers = listed.data.flatMap((e) => (e.type === "turn-complete" ? [e.data.text] : []));
  const record = await client.GET("/v1/runs/{run_id}", { params: { path } });
  if (!record.data) fail("getRun", record.error);
  const missing = await client.GET("/v1/runs/{run_id}", { params: { path: { run_id: "r-nosuchrun" } } });
  console.log(
    JSON.stringify({
      run_id: runId,
      seen,
      answered_by: answeredBy,
      ended,
      answers,
      status: record.data.status,
      turns: record.data.turns,
      missing: { status: missing.response.status, type: missing.error?.error.type },
    }),
  );
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
