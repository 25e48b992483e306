"""Provider adapters: one module per API shape, found through `registry`; one httpx transport.

Each adapter module (`openai_chat`, `openai_responses`, `anthropic_messages`,
`gemini_generate`) owns everything about its shape: the exact request, the
parsed response, error classification, usage and streamed usage, the URL path.
`registry` is the one list of shapes; the meter and the catalog only ask it.
"""
