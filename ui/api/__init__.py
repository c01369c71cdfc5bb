"""The HTTP APIs: the REST API (api, api_input, branch_api, plan_api, follow for long-polls), the OpenAI-compatible
endpoint (openai_api, openai_input), and the front door in front of them and the page (guard, ratelimit)."""
