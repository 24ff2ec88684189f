-- slogate usage tap: picks `usage` out of an inference response inside Envoy, so Python never
-- sees response chunks. It iterates the body chunk by chunk (nothing is buffered: each chunk
-- goes on to the client as soon as the loop has looked at it) and writes what it learnt into
-- dynamic metadata ("slogate.usage"); the gRPC access log carries it to the sidecar once per
-- request. With `data_path.usage_tap: native` Envoy's json_to_metadata reads small JSON
-- bodies instead and this script runs on the other responses only (streams, chunked or
-- large JSON): tooling/render/envoy_config/usage_tap.py says why.
--
-- Every API's usage shape is read: OpenAI's prompt_tokens / completion_tokens (chat,
-- completions, embeddings) and input_tokens / output_tokens (the Responses API's
-- `response.completed` event, Anthropic's `message_start` and `message_delta` events, and
-- their JSON bodies). The last value seen wins: Anthropic's running output count ends with
-- the final one. Anthropic's `input_tokens` leaves the prompt cache out (vLLM's final usage
-- too: `input_tokens` = prompt - cache read - cache written, its `message_start` the whole
-- prompt), so the prompt is `input_tokens` + `cache_read_input_tokens` +
-- `cache_creation_input_tokens`, each the last value seen. It also counts the SSE events of
-- a stream (`stream_events`), so that a stream cut before its usage arrived is settled with
-- what was sent.
--
-- The parts spend budgets price apart are read too: `cached_tokens` (vLLM's
-- prompt_tokens_details; Anthropic's cache_read_input_tokens) and `reasoning_tokens`
-- (completion_tokens_details), each the last value seen.
--
-- Metadata is written as soon as a value changes, inside the loop: a stream the client cuts
-- never reaches the end of the loop, and its access-log entry must still carry what was seen.
--
-- Only requests the sidecar decided on (namespace "slogate" present) are looked at. A usage
-- object or an event marker can straddle two chunks, so the last few bytes of the previous
-- chunk are searched again together with the next one. JSON-escaped text inside message
-- content (\"completion_tokens\") cannot match: the patterns need a bare quote.
--
-- When the sidecar added `stream_options.include_usage` itself (metadata strip_usage), the
-- client never asked for the usage chunk: it is read here, then cut out of the stream, so
-- clients written against the plain OpenAI stream see exactly that.
--
-- A stream's time to first token is timed at its first output event, not at its first byte:
-- a Responses stream sends `response.created` and `response.in_progress` as soon as it
-- starts, before any token, so its first byte says nothing about prefill. The tap notes the
-- time of the first body chunk and of the first event that carries output (OUTPUT_EVENTS, by
-- the API the stream's events name) and writes the difference (`first_output_delay_ms`);
-- the sidecar adds it to the first byte's time, which the access log measures from the
-- request's start (Lua has no clock of the request's start, only `timestamp()`: ms, wall
-- clock). Only streams are looked at, and only until their first output event.

local TAIL_BYTES = 96
local EVENT = "\ndata:"
local DONE = "\ndata: [DONE]"

-- The usage-only event of an OpenAI stream: `data: {...,"choices":[],...,"usage":{...}}`.
local function without_usage_events(data)
  return string.gsub(data, "data: (%b{})\r?\n\r?\n", function(event)
    if string.find(event, "\"choices\":%s*%[%s*%]") and string.find(event, "\"usage\":%s*{") then
      return ""
    end
    return nil
  end)
end

-- The first event of a stream says its API; until it has, no output is looked for (a
-- Responses stream's opening events echo the request's metadata, which could read as output).
local STREAM_APIS = {
  { api = "responses", marker = "\"type\":%s*\"response%." },
  { api = "messages", marker = "\"type\":%s*\"message_start\"" },
  { api = "openai", marker = "\"object\":%s*\"chat%.completion%.chunk\"" },
  { api = "openai", marker = "\"object\":%s*\"text_completion\"" },
}
-- What marks an event carrying output (a token of text, reasoning or a tool call), by API.
-- Not output: chat's opening chunk (`"role":"assistant","content":""`), the Responses API's
-- created / in_progress / output_item.added / content_part.added, Anthropic's message_start
-- and content_block_start (their text is empty). A bare quote is needed: JSON-escaped text
-- (\"content\":...) cannot match.
local OUTPUT_EVENTS = {
  -- response.output_text.delta, .reasoning_text.delta, .function_call_arguments.delta, ...
  responses = { "\"type\":%s*\"response%.[%w_%.]*delta\"" },
  messages = { "\"type\":%s*\"content_block_delta\"" },
  -- chat (content, reasoning, tool calls) and completions (text); an empty string is not
  openai = {
    "\"content\":%s*\"[^\"]",
    "\"reasoning_content\":%s*\"[^\"]",
    "\"reasoning\":%s*\"[^\"]",
    "\"tool_calls\":%s*%[%s*{",
    "\"text\":%s*\"[^\"]",
  },
}

local function stream_api(data)
  for _, known in ipairs(STREAM_APIS) do
    if string.find(data, known.marker) ~= nil then
      return known.api
    end
  end
  return nil
end

local function carries_output(data, api)
  for _, pattern in ipairs(OUTPUT_EVENTS[api]) do
    if string.find(data, pattern) ~= nil then
      return true
    end
  end
  return false
end

local function count(haystack, needle)
  local n = 0
  local at = 1
  while true do
    local found = string.find(haystack, needle, at, true)
    if found == nil then
      return n
    end
    n = n + 1
    at = found + 1
  end
end

-- The last value of the JSON member `name` in `data` (`"name": 123`); `current` when none.
local function last_count(data, name, current)
  for value in string.gmatch(data, "\"" .. name .. "\"%s*:%s*(%d+)") do
    current = tonumber(value)
  end
  return current
end

-- Handles from streamInfo() die at each yield (every chunk of the loop is one), so the
-- metadata object is fetched anew each time it is written instead of being kept.
local function publish(response_handle, key, value)
  response_handle:streamInfo():dynamicMetadata():set("slogate.usage", key, value)
end

-- Writes a count when it differs from the one written last under its key (`written`):
-- once per change, as soon as it changes (a cut stream never reaches the loop's end).
local function publish_changed(response_handle, written, key, value)
  if value ~= written[key] then
    written[key] = value
    publish(response_handle, key, value)
  end
end

function envoy_on_response(response_handle)
  local decided = response_handle:streamInfo():dynamicMetadata():get("slogate")
  if decided == nil then
    return
  end
  local strip = decided["strip_usage"] == true
  -- An event starts at a line start; the leading newline lets the first one match too.
  local tail = "\n"
  local written = {}
  local input = nil
  local cache_read = nil
  local cache_written = nil
  local events = 0
  local first_byte_ms = nil -- when the first body chunk came (ms, Envoy's wall clock)
  local api = nil -- the stream's API, once its events named it
  local output_seen = false
  for chunk in response_handle:bodyChunks() do
    if first_byte_ms == nil then
      first_byte_ms = response_handle:timestamp()
    end
    local bytes = chunk:getBytes(0, chunk:length())
    local data = tail .. bytes
    -- Markers wholly inside the tail were counted with the previous chunk.
    local new_events = (count(data, EVENT) - count(tail, EVENT)) - (count(data, DONE) - count(tail, DONE))
    if new_events > 0 then
      events = events + new_events
      publish(response_handle, "stream_events", events)
    end
    if events > 0 and not output_seen then
      api = api or stream_api(data)
      if api ~= nil and carries_output(data, api) then
        output_seen = true
        publish(response_handle, "first_output_delay_ms", response_handle:timestamp() - first_byte_ms)
      end
    end
    if string.find(data, "_tokens\"", 1, true) ~= nil then
      input = last_count(data, "prompt_tokens", input)
      input = last_count(data, "input_tokens", input)
      cache_read = last_count(data, "cache_read_input_tokens", cache_read)
      cache_written = last_count(data, "cache_creation_input_tokens", cache_written)
      if input ~= nil then
        publish_changed(response_handle, written, "prompt_tokens", input + (cache_read or 0) + (cache_written or 0))
      end
      local completion = last_count(data, "completion_tokens", written.completion_tokens)
      completion = last_count(data, "output_tokens", completion)
      publish_changed(response_handle, written, "completion_tokens", completion)
      local cached = last_count(data, "cached_tokens", written.cached_tokens)
      cached = last_count(data, "cache_read_input_tokens", cached)
      publish_changed(response_handle, written, "cached_tokens", cached)
      local reasoning = last_count(data, "reasoning_tokens", written.reasoning_tokens)
      publish_changed(response_handle, written, "reasoning_tokens", reasoning)
      if strip then
        local kept, removed = without_usage_events(bytes)
        if removed > 0 then
          chunk:setBytes(kept)
        end
      end
    end
    if #data > TAIL_BYTES then
      tail = string.sub(data, -TAIL_BYTES)
    else
      tail = data
    end
  end
end
