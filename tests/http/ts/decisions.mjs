// The official TypeScript SDK (openai on npm) against the gateway: argv[2] is the base URL,
// argv[3] the API key. Prints one JSON line with what the test checks.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: process.argv[3], maxRetries: 0 });
const decision = await client.decisions.create({
  model: "gpt-6-luna",
  input: [{ role: "user", content: [{ type: "input_text", text: "I was charged twice" }] }],
  questions: [
    { type: "predicate", name: "urgent", instructions: "Is this urgent?" },
    { type: "choice", instructions: "Refund?", choices: [{ value: true }, { value: "true" }] },
    { type: "score", name: "anger", instructions: "How angry?",
      levels: [{ label: "calm" }, { label: "furious" }] },
  ],
});
let error = null;
try {
  await client.decisions.create({ model: "nope", input: "x",
    questions: [{ type: "predicate", instructions: "x" }] });
} catch (e) {
  error = { class: e.constructor.name, status: e.status, param: e.param, code: e.code };
}
console.log(JSON.stringify({ decision, error }));
