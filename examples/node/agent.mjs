// The calculator agent in JavaScript: the official `openai` package, nothing of Agent Lightning.
//
// Trained by `agl train --agent-command "node agent.mjs" --app-dir examples/node ...` (README.md). The runner starts
// this program for each rollout: the task comes as JSON on stdin, the LLM proxy's URL, key and model in
// OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL (which the openai package reads by itself), the sampling settings
// of the run in AGL_SAMPLING_PARAMETERS; the reward goes out as the last line of stdout. The loop is the one of
// examples/calc/calc_openai_agent.py: ask with the calculator offered as a tool, run the tool call, ask again, score.
import OpenAI from "openai";

const MAX_LLM_CALLS = 2;
const TOOLS = [
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression made of integers, + - * and parentheses.",
      parameters: {
        type: "object",
        properties: { expression: { type: "string" } },
        required: ["expression"],
      },
    },
  },
];

// The calculator: the integer value of the expression, or "E" for anything it cannot evaluate.
export function evaluate(expression) {
  if (typeof expression !== "string" || !/^[0-9+\-*() ]{1,64}$/.test(expression)) return "E";
  try {
    const value = Function(`"use strict"; return (${expression});`)(); // only digits and + - * ( ) reach here
    return Number.isFinite(value) ? String(Math.trunc(value)) : "E";
  } catch {
    return "E";
  }
}

function runTool(args) {
  try {
    return evaluate(JSON.parse(args).expression);
  } catch {
    return "E";
  }
}

// 1 for "A:<expected>", 0 for another "A:<number>", -0.1 for anything else.
export function score(text, expected) {
  const match = /^A:(-?\d+)$/.exec((text ?? "").trim());
  if (match === null) return -0.1;
  return Number(match[1]) === expected ? 1.0 : 0.0;
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function solve(task) {
  const client = new OpenAI({ maxRetries: 2 }); // base URL and key from the environment
  const sampling = JSON.parse(process.env.AGL_SAMPLING_PARAMETERS || "{}");
  const messages = [{ role: "user", content: task.question }];
  for (let call = 0; call < MAX_LLM_CALLS; call++) {
    const response = await client.chat.completions.create({
      model: process.env.OPENAI_MODEL,
      messages,
      tools: TOOLS,
      ...sampling,
    });
    const message = response.choices[0].message;
    if (!message.tool_calls?.length) return score(message.content, Number(task.answer));
    messages.push({ role: "assistant", tool_calls: message.tool_calls, ...(message.content ? { content: message.content } : {}) });
    for (const toolCall of message.tool_calls) {
      const result = toolCall.function.name === "calculator" ? runTool(toolCall.function.arguments) : "E";
      messages.push({ role: "tool", tool_call_id: toolCall.id, content: result });
    }
  }
  return -0.1; // still wanted the tool when the call budget ran out
}

const task = JSON.parse(await readStdin());
const reward = await solve(task);
console.log(JSON.stringify({ reward })); // the last line of stdout: the rollout's reward
