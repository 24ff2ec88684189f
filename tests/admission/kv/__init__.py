"""Tests of admission/kv/: KV admission's capacity rule and its books (local, Redis)."""
