-- slogate usage tap: picks `usage` out of an inference response inside Envoy, so Python never
-- sees response chunks. It iterates the body chunk by chunk (nothing is buffered: each chunk
-- goes on to the client as soon as the loop has looked at it) and writes the last
-- prompt_tokens / completion_tokens it saw into dynamic metadata; the gRPC access log carries
-- them to the sidecar once per request.
--
-- Only requests the sidecar decided on (namespace "slogate" present) are looked at.
-- The usage object of an SSE stream can straddle two chunks, so the last few bytes of the
-- previous chunk are searched again together with the next one. JSON-escaped text inside
-- message content (\"completion_tokens\") cannot match: the pattern needs a bare quote.
--
-- When the sidecar added `stream_options.include_usage` itself (metadata strip_usage), the
-- client never asked for the usage chunk: it is read here, then cut out of the stream, so
-- clients written against the plain OpenAI stream see exactly that.

local TAIL_BYTES = 96

-- The usage-only event of an OpenAI stream: `data: {...,"choices":[],...,"usage":{...}}`.
local function without_usage_events(data)
  return string.gsub(data, "data: (%b{})\r?\n\r?\n", function(event)
    if string.find(event, "\"choices\":%s*%[%s*%]") and string.find(event, "\"usage\":%s*{") then
      return ""
    end
    return nil
  end)
end

-- Handles from streamInfo() die at each yield (every chunk of the loop is one), so the
-- metadata object is fetched again after the loop instead of being kept.
function envoy_on_response(response_handle)
  local decided = response_handle:streamInfo():dynamicMetadata():get("slogate")
  if decided == nil then
    return
  end
  local strip = decided["strip_usage"] == true
  local tail = ""
  local prompt = nil
  local completion = nil
  for chunk in response_handle:bodyChunks() do
    local bytes = chunk:getBytes(0, chunk:length())
    local data = tail .. bytes
    if string.find(data, "_tokens\"", 1, true) ~= nil then
      for value in string.gmatch(data, "\"prompt_tokens\"%s*:%s*(%d+)") do
        prompt = value
      end
      for value in string.gmatch(data, "\"completion_tokens\"%s*:%s*(%d+)") do
        completion = value
      end
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
  local metadata = response_handle:streamInfo():dynamicMetadata()
  if prompt ~= nil then
    metadata:set("slogate.usage", "prompt_tokens", tonumber(prompt))
  end
  if completion ~= nil then
    metadata:set("slogate.usage", "completion_tokens", tonumber(completion))
  end
end
