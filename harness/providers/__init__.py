"""Providers: one `Provider` subclass per API shape, found through `registry`; one httpx transport.

Each shape's class (`OpenAIChat`, `OpenAIResponses`, `AnthropicMessages`,
`GeminiGenerate`, each in its own module) owns everything about its shape: the
exact request, the parsed response, error classification, usage and streamed
usage, the URL path; `provider.Provider` holds the defaults they share.
`registry` is the one list of shapes; the meter and the catalog only ask it.

The manual: docs/models.md.
"""
