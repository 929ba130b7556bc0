//! 503 while the engine is not serving, over real HTTP: while the model loads,
//! after it failed to load, and after the endpoint shut its engine down.
use rlmesh_model::Tokenizer;
use rlmesh_serve::batcher::{BatchPolicy, Batcher, Readiness};
use rlmesh_serve::engine::ModelEngine;
use rlmesh_serve::{Endpoint, ServeConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn model_dir() -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = std::process::Command::new(root.join("scripts/prepare-models.sh")).output().expect("run scripts/prepare-models.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim()).join("smollm2-135m")
}

/// POST `body` to `path`: (status, body).
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

const HI: &str = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_get_503_until_the_model_has_loaded_and_after_shutdown() {
    let dir = model_dir();
    let tokenizer = Arc::new(Tokenizer::load(&dir).unwrap());
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (tk, d) = (tokenizer.clone(), dir.clone());
    // The real engine, whose loading waits for the test to let it go.
    let batcher = Batcher::spawn(
        move || {
            released.recv().map_err(|e| e.to_string())?;
            ModelEngine::load(&d, tch::Device::Cpu, tk)
        },
        BatchPolicy::default(),
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = Endpoint::start(listener, ServeConfig::default(), tokenizer, batcher).unwrap();
    let addr = endpoint.local_addr();
    let (status, body) = post(addr, "/v1/chat/completions", HI).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "service_unavailable");
    assert!(body["error"]["message"].as_str().unwrap().contains("loading"), "{body}");
    release.send(()).unwrap();
    while endpoint.readiness() == Readiness::Loading {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = post(addr, "/v1/chat/completions", HI).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    endpoint.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "nothing listens after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_failed_to_load_answers_503_with_the_reason() {
    let dir = model_dir();
    let tokenizer = Arc::new(Tokenizer::load(&dir).unwrap());
    let tk = tokenizer.clone();
    let missing = tempfile::tempdir().unwrap();
    let gone = missing.path().to_path_buf();
    let batcher = Batcher::spawn(move || ModelEngine::load(&gone, tch::Device::Cpu, tk), BatchPolicy::default(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = Endpoint::start(listener, ServeConfig::default(), tokenizer, batcher).unwrap();
    while endpoint.readiness() == Readiness::Loading {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = post(endpoint.local_addr(), "/v1/chat/completions", HI).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not serving"), "{body}");
    endpoint.shutdown().await;
}
