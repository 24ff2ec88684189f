"""Inference bodies of every API slogate guards: read them, and rewrite them in one place.

What lives here:
- `parse`      `parse_inference_body(shape, body)`: an `InferenceRequest`, or `InvalidRequest`
               (malformed JSON, wrong types naming the field, nesting too deep).
- `request`    `InferenceRequest`, what slogate reads out of any body, whichever API.
- `openai`, `responses`, `anthropic`  one reader per API's body.
- `rewrite`    the one place that changes a body before it goes upstream (`rewritten_body`,
               `adds_usage`).

Names are imported from the module that defines them.
"""
