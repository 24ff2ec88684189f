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

local TAIL_BYTES = 96

-- Handles from streamInfo() die at each yield (every chunk of the loop is one), so the
-- metadata object is fetched again after the loop instead of being kept.
function envoy_on_response(response_handle)
  if response_handle:streamInfo():dynamicMetadata():get("slogate") == nil then
    return
  end
  local tail = ""
  local prompt = nil
  local completion = nil
  for chunk in response_handle:bodyChunks() do
    local data = tail .. chunk:getBytes(0, chunk:length())
    if string.find(data, "_tokens\"", 1, true) ~= nil then
      for value in string.gmatch(data, "\"prompt_tokens\"%s*:%s*(%d+)") do
        prompt = value
      end
      for value in string.gmatch(data, "\"completion_tokens\"%s*:%s*(%d+)") do
        completion = value
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
