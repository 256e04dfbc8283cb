"""The server the official MCP conformance suite tests, as replicas on one store.

``@modelcontextprotocol/conformance`` tests a server through the tools,
resources and prompts its scenarios name: the "everything" set of the
2025-11-25 and 2026-07-28 requirement sets, and the fixtures of the tasks
extension's scenarios (``greet``, ``slow_compute``, ``failing_job``,
``protocol_error_job``, ``confirm_delete``, ``multi_input``,
``test_tool_with_task``). This server defines them on the official SDK's
``MCPServer`` and serves them through replaystore's public API with its
default wiring: no request-state key and no listen bus are passed, so any
number of these processes on one Redis URL are replicas of each other, and a
client may send each request to any of them.

Run one replica::

    python examples/conformance_server.py --port 3001 --url redis://127.0.0.1:6379/0

``scripts/conformance`` runs the suite against one process and against three
replicas behind a round-robin proxy, and prints both results side by side.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import Prompt, UserMessage
from mcp.server.mcpserver.tools.base import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, Field

from replaystore import ReplayBuffer
from replaystore.mcp import streamable_http_app
from replaystore.mcp.tasks import ReplayTasks, TaskSupport

__all__ = ["NAME", "build_app", "build_server", "main"]

#: The server's name, hence the namespace of its tasks and the audience of its requestState.
NAME = "replaystore-conformance"

#: A 1x1 PNG and a tiny WAV: the suite checks the content type, not the picture.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0"
    "gAAAABJRU5ErkJggg=="
)
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

#: How each tool runs for a 2026-07-28 client that declares the tasks extension.
TASK_TOOLS = {
    "slow_compute": TaskSupport("optional"),
    "failing_job": TaskSupport("required"),
    "protocol_error_job": TaskSupport("optional"),
    "confirm_delete": TaskSupport("optional"),
    "multi_input": TaskSupport("optional"),
    "test_tool_with_task": TaskSupport("required"),
}


def _form(message: str, **properties: str) -> ElicitRequest:
    """An elicitation asking for string or boolean fields (all required)."""
    schema = {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sampling(text: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _field(answer: object, name: str) -> Any:
    """A field of an accepted elicitation's content (None otherwise)."""
    if isinstance(answer, ElicitResult) and answer.content:
        return answer.content.get(name)
    return None


class _Reply(BaseModel):
    response: str = Field(description="The user's response")


class _Confirm(BaseModel):
    confirm: bool = Field(description="Whether to go ahead")


class _Name(BaseModel):
    name: str = Field(description="A name")


class _Defaults(BaseModel):
    """An elicitation schema with a default for every primitive type (what the suite asks)."""

    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: str = Field(
        default="active",
        description="User status",
        json_schema_extra={"enum": ["active", "inactive", "pending"]},
    )
    verified: bool = Field(default=True, description="Verification status")


class _Enums(BaseModel):
    """Every enum shape an elicitation schema may use: titled, untitled, single and multiple."""

    untitledSingle: str = Field(
        description="Simple enum without titles",
        json_schema_extra={"enum": ["active", "inactive", "pending"]},
    )
    titledSingle: str = Field(
        description="Enum with titled options (oneOf)",
        json_schema_extra={
            "oneOf": [
                {"const": "low", "title": "Low Priority"},
                {"const": "medium", "title": "Medium Priority"},
                {"const": "high", "title": "High Priority"},
            ]
        },
    )
    untitledMulti: list[str] = Field(
        description="Multi-select without titles",
        json_schema_extra={"items": {"type": "string", "enum": ["read", "write", "execute"]}},
    )
    titledMulti: list[str] = Field(
        description="Multi-select with titled options",
        json_schema_extra={
            "items": {
                "anyOf": [
                    {"const": "feature", "title": "New Feature"},
                    {"const": "bug", "title": "Bug Fix"},
                    {"const": "docs", "title": "Documentation"},
                ]
            }
        },
    )
    legacyEnum: str = Field(
        description="Legacy enum with enumNames",
        json_schema_extra={
            "enum": ["small", "medium", "large"],
            "enumNames": ["Small Size", "Medium Size", "Large Size"],
        },
    )


async def _input_first(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """``test_tool_with_task`` asks for input before it becomes a task (MRTR, then a task).

    A tool that requires a task becomes one as soon as it is called; this
    tool first gathers its input on the 2026-07-28 multi-round loop, so its
    first round is answered here, before the tasks extension sees the call.
    The round carrying the answer goes on to the extension and runs as a task.
    """
    params = ctx.params or {}
    if (
        ctx.method == "tools/call"
        and params.get("name") == "test_tool_with_task"
        and not params.get("inputResponses")
    ):
        return InputRequiredResult(
            input_requests={"user_name": _form("What is your name?", name="string")},
            request_state="gathering-name",
        )
    return await call_next(ctx)


#: An input schema with the JSON Schema 2020-12 keywords the suite looks for in ``tools/list``.
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _schema_2020_12_tool() -> Tool:
    """A tool listed with :data:`SCHEMA_2020_12` as its input schema, kept as written."""

    def json_schema_2020_12_tool() -> str:
        """Lists a JSON Schema 2020-12 input schema."""
        return "json_schema_2020_12_tool"

    tool = Tool.from_function(json_schema_2020_12_tool)
    tool.parameters = SCHEMA_2020_12
    return tool


def build_server(tasks: ReplayTasks) -> MCPServer:
    """The server with every fixture the suite's server scenarios call."""
    server = MCPServer(
        NAME,
        version="1.0.0",
        tools=[_schema_2020_12_tool()],
        extensions=[tasks],
        middleware=[_input_first],
    )
    _content_tools(server)
    _client_request_tools(server)
    _input_required_tools(server)
    _task_tools(server)
    _change_tools(server)
    _resources_and_prompts(server)
    return server


def _content_tools(server: MCPServer) -> None:
    @server.tool()
    def test_simple_text() -> str:
        """Answers one text block."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> list[ImageContent]:
        """Answers one image."""
        return [ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool()
    def test_audio_content() -> list[AudioContent]:
        """Answers one audio clip."""
        return [AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[EmbeddedResource]:
        """Answers one embedded resource."""
        resource = TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        )
        return [EmbeddedResource(type="resource", resource=resource)]

    @server.tool()
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        """Answers text, an image and a resource together."""
        resource = TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text='{"test": "data", "value": 123}',
        )
        return [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]

    @server.tool()
    def test_x_mcp_header(
        region: Annotated[
            str,
            Field(
                description="Sent as the Mcp-Param-Region header too",
                json_schema_extra={"x-mcp-header": "Region"},
            ),
        ] = "<none>",
    ) -> str:
        """Has a parameter mirrored into a header, which the server checks against the body."""
        return f"region={region}"

    @server.tool()
    def test_error_handling() -> str:
        """Fails: the client gets a result with isError."""
        raise ToolError("This tool intentionally returns an error for testing")

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Logs three messages while it runs."""
        for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.session.send_log_message("info", text, related_request_id=ctx.request_id)
            await anyio.sleep(0.05)
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress three times, and answers the progress token."""
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
            await anyio.sleep(0.05)
        meta = ctx.request_context.meta
        return str(meta.get("progress_token") if meta else 0)

    @server.tool()
    async def test_reconnection(ctx: Context) -> str:
        """Closes its SSE stream mid-call: the client resumes it."""
        await ctx.session.send_log_message(
            "info", "Before disconnect", related_request_id=ctx.request_id
        )
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        await ctx.session.send_log_message(
            "info", "After reconnect", related_request_id=ctx.request_id
        )
        return "Reconnection test completed"


def _client_request_tools(server: MCPServer) -> None:
    """Server-to-client requests on a 2025-11-25 session (the answer may reach any replica)."""

    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client's model, and answers what it said."""
        message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
        result = await ctx.session.create_message(
            messages=[message], max_tokens=100, related_request_id=ctx.request_id
        )
        content = result.content
        text = content.text if isinstance(content, TextContent) else "No response"
        return f"LLM response: {text}"

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user, and answers what they said."""
        result = await ctx.elicit(message=message, schema=_Reply)
        content = result.data.model_dump_json() if isinstance(result, AcceptedElicitation) else "{}"
        return f"User response: action={result.action}, content={content}"

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Asks with a default for every field."""
        result = await ctx.elicit(message="Please provide user information", schema=_Defaults)
        content = result.data.model_dump_json() if isinstance(result, AcceptedElicitation) else "{}"
        return f"Elicitation result: action={result.action}, content={content}"

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Asks with every enum shape."""
        result = await ctx.elicit(
            message="Please select values using different enum schema types", schema=_Enums
        )
        content = result.data.model_dump_json() if isinstance(result, AcceptedElicitation) else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @server.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the client's sampling capability: a protocol error without it."""
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="This tool requires the client 'sampling' capability",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "Client declared sampling capability; proceeding."


def _input_required_tools(server: MCPServer) -> None:
    """Multi-round calls (2026-07-28): each round may reach another replica."""

    @server.tool()
    async def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
        """Asks a name through an InputRequiredResult."""
        answers = ctx.input_responses or {}
        if "user_name" in answers:
            return f"Hello, {_field(answers['user_name'], 'name') or 'stranger'}!"
        return InputRequiredResult(
            input_requests={"user_name": _form("What is your name?", name="string")}
        )

    @server.tool()
    async def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
        """Asks the client's model through an InputRequiredResult."""
        answers = ctx.input_responses or {}
        if "capital_question" in answers:
            answer = answers["capital_question"]
            ok = isinstance(answer, CreateMessageResult) and answer.content.type == "text"
            return f"Model said: {answer.content.text if ok else '?'}"  # type: ignore[union-attr]
        question = _sampling("What is the capital of France?", 100)
        return InputRequiredResult(input_requests={"capital_question": question})

    @server.tool()
    async def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
        """Asks the client's roots through an InputRequiredResult."""
        answers = ctx.input_responses or {}
        if "client_roots" in answers:
            answer = answers["client_roots"]
            count = len(answer.roots) if isinstance(answer, ListRootsResult) else 0
            return f"Client exposed {count} root(s)."
        return InputRequiredResult(input_requests={"client_roots": ListRootsRequest()})

    @server.tool()
    async def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
        """Completes only when its requestState comes back intact."""
        answers = ctx.input_responses or {}
        if "confirm" in answers and ctx.request_state == "request-state-nonce":
            return "state-ok: confirmation received"
        return InputRequiredResult(
            input_requests={"confirm": _form("Please confirm", ok="boolean")},
            request_state="request-state-nonce",
        )

    @server.tool()
    async def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
        """Asks an elicitation, a sampling and the roots in one round."""
        answers = ctx.input_responses or {}
        if {"user_name", "greeting", "client_roots"} <= answers.keys():
            return "All inputs received."
        return InputRequiredResult(
            input_requests={
                "user_name": _form("What is your name?", name="string"),
                "greeting": _sampling("Generate a greeting", 50),
                "client_roots": ListRootsRequest(),
            },
            request_state="multiple-inputs",
        )

    @server.tool()
    async def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
        """Three rounds; the requestState of each says which round comes next."""
        state = json.loads(ctx.request_state) if ctx.request_state else {"round": 0}
        answers = ctx.input_responses or {}
        if state.get("round") == 1 and "step1" in answers:
            return InputRequiredResult(
                input_requests={
                    "step2": _form("Step 2: What is your favorite color?", color="string")
                },
                request_state=json.dumps({"round": 2, "name": _field(answers["step1"], "name")}),
            )
        if state.get("round") == 2 and "step2" in answers:
            return f"{state.get('name')} likes {_field(answers['step2'], 'color')}."
        return InputRequiredResult(
            input_requests={"step1": _form("Step 1: What is your name?", name="string")},
            request_state=json.dumps({"round": 1}),
        )

    @server.tool()
    async def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
        """Echoes its requestState: a tampered one never reaches it (the SDK refuses it)."""
        if ctx.request_state is None:
            return InputRequiredResult(
                input_requests={"confirm": _form("Please confirm", ok="boolean")},
                request_state="round-1",
            )
        return f"state-ok: {ctx.request_state}"

    @server.tool()
    async def test_input_required_result_capabilities(ctx: Context) -> InputRequiredResult:
        """Asks only what the client declared it can answer."""
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is None or capabilities.sampling is not None:
            requests["sample"] = _sampling("Say hello", 50)
        if capabilities is None or capabilities.elicitation is not None:
            requests["ask"] = _form("What is your name?", name="string")
        return InputRequiredResult(input_requests=requests, request_state="capability-gated")

    @server.prompt()
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[UserMessage] | InputRequiredResult:
        """A prompt that asks for its context first (a multi-round prompts/get)."""
        answers = ctx.input_responses or {}
        if "user_context" in answers:
            text = _field(answers["user_context"], "context") or "?"
            return [UserMessage(role="user", content=f"Use the following context: {text}")]
        ask = _form("What context should the prompt use?", context="string")
        return InputRequiredResult(input_requests={"user_context": ask})


def _task_tools(server: MCPServer) -> None:
    """The fixtures of the tasks extension's scenarios (run as tasks when the client opts in)."""

    @server.tool()
    def greet(name: str) -> str:
        """Greets, always as a plain call."""
        return f"Hello, {name}!"

    @server.tool()
    async def slow_compute(seconds: float = 1.0, label: str = "") -> str:
        """Sleeps ``seconds``, then answers (a task when the client opts in)."""
        await anyio.sleep(seconds)
        return f"computed {label or 'result'} after {seconds}s"

    @server.tool()
    async def failing_job() -> str:
        """Reports a tool error after about a second (a task that completes with isError)."""
        await anyio.sleep(1.0)
        raise ToolError("failing_job always fails")

    @server.tool()
    async def protocol_error_job() -> str:
        """Fails with a protocol error (a task that ends failed)."""
        raise MCPError(INTERNAL_ERROR, "protocol_error_job raised a protocol error")

    @server.tool()
    async def confirm_delete(ctx: Context, item: str = "the item") -> str:
        """Asks for a confirmation, then answers."""
        answer = await ctx.elicit(f"Delete {item}?", _Confirm)
        if isinstance(answer, AcceptedElicitation) and answer.data.confirm:
            return f"deleted {item}"
        return f"kept {item} ({answer.action})"

    @server.tool()
    async def multi_input(ctx: Context) -> str:
        """Asks two questions at once, so two input requests are pending together."""
        names: dict[str, str] = {}

        async def ask(key: str, question: str) -> None:
            answer = await ctx.elicit(question, _Name)
            names[key] = answer.data.name if isinstance(answer, AcceptedElicitation) else "-"

        async with anyio.create_task_group() as group:
            group.start_soon(ask, "first", "First name?")
            group.start_soon(ask, "second", "Second name?")
        return f"first={names['first']} second={names['second']}"

    @server.tool()
    async def test_tool_with_task(ctx: Context) -> str:
        """Runs as a task once its first round gathered a name (see ``_input_first``)."""
        answers = ctx.input_responses or {}
        name = _field(answers.get("user_name"), "name") or "stranger"
        await anyio.sleep(0.2)
        return f"Hello, {name}! (from a task)"


def _change_tools(server: MCPServer) -> None:
    """Tools whose effect a listen stream on any replica sees (2026-07-28)."""

    def dynamic() -> str:
        """Added and removed by test_trigger_tool_change."""
        return "dynamic"

    @server.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Changes the tool list and says so to every listener."""
        server.add_tool(dynamic, name="test_dynamic_tool")
        server.remove_tool("test_dynamic_tool")
        await ctx.notify_tools_changed()
        return "tool list changed"

    @server.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Changes the prompt list and says so to every listener."""
        prompt = Prompt.from_function(dynamic, name="test_dynamic_prompt", description="dynamic")
        server.add_prompt(prompt)
        server.remove_prompt("test_dynamic_prompt")
        await ctx.notify_prompts_changed()
        return "prompt list changed"


def _resources_and_prompts(server: MCPServer) -> None:
    @server.resource("test://static-text")
    def static_text() -> str:
        """A static text resource."""
        return "This is the content of the static text resource."

    @server.resource("test://static-binary")
    def static_binary() -> bytes:
        """A static binary resource (a PNG)."""
        return base64.b64decode(PNG)

    @server.resource("test://template/{id}/data")
    def template(id: str) -> str:
        """A resource template."""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource("test://watched-resource")
    def watched() -> str:
        """A resource clients subscribe to."""
        return "Watched resource content"

    @server.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments."""
        return [UserMessage(role="user", content="This is a simple prompt for testing.")]

    @server.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with two arguments."""
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(role="user", content=text)]

    @server.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        """A prompt embedding a resource."""
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(role="user", content=EmbeddedResource(type="resource", resource=resource)),
            UserMessage(role="user", content="Please process the embedded resource above."),
        ]

    @server.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt with an image."""
        return [
            UserMessage(
                role="user", content=ImageContent(type="image", data=PNG, mime_type="image/png")
            ),
            UserMessage(role="user", content="Please analyze the image above."),
        ]

    @server.completion()  # type: ignore[untyped-decorator, no-untyped-call]
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        """No suggestions: the suite checks the shape of the answer."""
        return Completion(values=[], total=0, has_more=False)

    async def set_level(
        ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        return EmptyResult()

    async def subscribe(
        ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        return EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        return EmptyResult()

    # MCPServer has no public registration for these 2025-11-25 methods; its
    # low-level server does.
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)


def build_app(url: str, *, host: str = "127.0.0.1", share: bool = True) -> Any:
    """The ASGI app of one replica on the store at ``url`` (its buffer closed with the app).

    ``share=False`` keeps the SDK's per-process ``requestState`` key and listen
    bus, to see what the default wiring changes.
    """
    tasks = ReplayTasks(TASK_TOOLS, poll_interval=0.2, check_interval=0.1)
    server = build_server(tasks)
    buffer = ReplayBuffer.from_url(url)
    return streamable_http_app(
        server, buffer, tasks=tasks, retry_interval=100, host=host, close_buffer=True, share=share
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3001)
    parser.add_argument("--url", default="memory://", help="the store: memory://, redis://…")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--no-share",
        action="store_true",
        help="keep the per-process requestState key and listen bus (share=False)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    app = build_app(args.url, host=args.host, share=not args.no_share)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
