//! One MCP session with a server: started (a child on stdio) or reached
//! (Streamable HTTP), initialized, then `tools/list` and `tools/call`, each
//! under the server's time limit. A call's result becomes text.
use crate::child::{self, Child};
use crate::error::McpError;
use crate::spec::{ServerSpec, Transport};
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, ContentBlock, Implementation, JsonObject, ResourceContents};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use std::time::Duration;

/// How long a failed start waits for the child's last stderr lines.
const STDERR_GRACE: Duration = Duration::from_secs(2);

/// A live MCP session; dropping it ends the session and kills its child's process group.
pub(crate) struct Connection {
    server: String,
    service: RunningService<RoleClient, ClientConfig>,
    child: Option<Child>,
}

fn client_config() -> ClientConfig {
    let mut info = ClientConfig::default();
    info.client_info = Implementation::new("rlmesh", env!("CARGO_PKG_VERSION"));
    info
}

impl Connection {
    /// Starts or reaches the server and completes `initialize`, within its start limit.
    pub(crate) async fn open(spec: &ServerSpec) -> Result<Connection, McpError> {
        let server = spec.name.clone();
        let start_err = |reason: String, stderr: String| McpError::Start { server: server.clone(), reason, stderr };
        let limit = spec.start_timeout();
        match spec.transport() {
            Transport::Stdio(argv) => {
                let spawned = child::spawn(spec, argv).map_err(|e| start_err(format!("cannot run {:?}: {e}", argv[0]), String::new()))?;
                let child = spawned.child;
                let served = tokio::time::timeout(limit, client_config().serve((spawned.stdout, spawned.stdin))).await;
                match served {
                    Ok(Ok(service)) => Ok(Connection { server, service, child: Some(child) }),
                    Ok(Err(e)) => Err(start_err(format!("initialize failed: {e}"), child.final_stderr(STDERR_GRACE).await)),
                    Err(_) => Err(start_err(format!("no answer to initialize within {limit:?}"), child.final_stderr(STDERR_GRACE).await)),
                }
            }
            Transport::Http(url) => {
                let transport = StreamableHttpClientTransport::from_uri(url);
                match tokio::time::timeout(limit, client_config().serve(transport)).await {
                    Ok(Ok(service)) => Ok(Connection { server, service, child: None }),
                    Ok(Err(e)) => Err(start_err(format!("initialize at {url} failed: {e}"), String::new())),
                    Err(_) => Err(start_err(format!("no answer to initialize at {url} within {limit:?}"), String::new())),
                }
            }
        }
    }

    /// The child's process id (a stdio server).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::pid)
    }

    /// Whether the session is over: its loop ended, or its child exited.
    pub(crate) fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed() || self.child.as_ref().is_some_and(Child::exited)
    }

    /// Ends the session now: kills the child's process group (in-flight calls fail).
    pub(crate) fn kill(&self) {
        if let Some(c) = &self.child {
            c.kill();
        }
    }

    /// The end of the child's stderr (empty for an HTTP server).
    pub(crate) fn stderr(&self) -> String {
        self.child.as_ref().map(Child::stderr).unwrap_or_default()
    }

    /// `tools/list`, every page.
    pub(crate) async fn list_tools(&self, limit: Duration) -> Result<Vec<rmcp::model::Tool>, McpError> {
        match tokio::time::timeout(limit, self.service.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(McpError::Tools { server: self.server.clone(), reason: format!("tools/list failed: {e}") }),
            Err(_) => Err(McpError::Tools { server: self.server.clone(), reason: format!("no answer to tools/list within {limit:?}") }),
        }
    }

    /// `tools/call`: the result's text, [`McpError::Call`] when the server
    /// answers with an error, [`McpError::TimedOut`] or [`McpError::Died`]
    /// when the server is at fault (the caller restarts it).
    pub(crate) async fn call(&self, tool: &str, arguments: JsonObject, limit: Duration) -> Result<String, McpError> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let called = tokio::time::timeout(limit, self.service.call_tool(params)).await;
        let (server, tool) = (self.server.clone(), tool.to_string());
        match called {
            Err(_) => Err(McpError::TimedOut { server, tool, ms: limit.as_millis() as u64 }),
            Ok(Ok(result)) => match result_text(&result) {
                text if result.is_error == Some(true) => Err(McpError::Call { server, tool, reason: text }),
                text => Ok(text),
            },
            Ok(Err(ServiceError::McpError(e))) => Err(McpError::Call { server, tool, reason: e.message.to_string() }),
            Ok(Err(e)) => {
                // The last stderr lines of a child that just died may still be in the pipe.
                if self.child.is_some() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(McpError::Died { server, tool, reason: e.to_string(), stderr: self.stderr() })
            }
        }
    }
}

/// A call result as text: the text blocks joined by newlines, other blocks
/// summarised in brackets; the structured content when there is no content.
pub(crate) fn result_text(result: &CallToolResult) -> String {
    let parts: Vec<String> = result.content.iter().map(block_text).collect();
    if parts.is_empty() {
        return result.structured_content.as_ref().map(|v| v.to_string()).unwrap_or_default();
    }
    parts.join("\n")
}

fn block_text(block: &ContentBlock) -> String {
    let size = |b64: &str| (b64.len() / 4 * 3).saturating_sub(b64.bytes().rev().take_while(|&c| c == b'=').count());
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image: {}, {} bytes]", i.mime_type, size(&i.data)),
        ContentBlock::Audio(a) => format!("[audio: {}, {} bytes]", a.mime_type, size(&a.data)),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents { text, .. } => text.clone(),
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                format!("[resource {uri}: {}, {} bytes]", mime_type.as_deref().unwrap_or("binary"), size(blob))
            }
            _ => "[a resource of an unknown kind]".to_string(),
        },
        ContentBlock::ResourceLink(l) => format!("[resource link: {} ({})]", l.uri, l.name),
        _ => "[content of an unknown kind]".to_string(),
    }
}
