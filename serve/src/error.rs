//! Errors as OpenAI's API returns them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer of the endpoint.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// OpenAI's machine-readable code, if it has one.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", param: param.map(str::to_string), code: None }
    }

    /// 400: the prompt and the completion do not fit the model's context.
    pub fn context_overflow(prompt: usize, wanted: usize, context: usize) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(
                format!(
                    "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the messages, {wanted} in the completion). Please reduce the length of the messages or completion.",
                    prompt + wanted
                ),
                Some("messages"),
            )
        }
    }

    /// 401: no key, or not one this endpoint knows (or a finished session's).
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, message: message.into(), kind: "invalid_request_error", param: None, code: Some("invalid_api_key") }
    }

    /// 404: no such model or route.
    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into(), kind: "invalid_request_error", param: None, code: Some(code) }
    }

    /// 413: the body is over the endpoint's limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is over this endpoint's limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 429: too many requests in flight.
    pub fn too_many(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("{limit} requests are in flight, this endpoint's limit; retry later"),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// 503: the engine is not serving (loading, failed, shutting down).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), kind: "server_error", param: None, code: Some("service_unavailable") }
    }

    /// 500: the engine failed on a request it accepted.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), kind: "server_error", param: None, code: None }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
