//! The web UI (docs/ui.md): one HTML page, its stylesheet and its script,
//! built into the binary (`include_str!`, no build step), served by the
//! same router as the API and behind the same authentication (on TCP the
//! bearer token, or the cookie `session` sets from the first visit's
//! `?token=`). The page reads the JSON API and follows `/api/events`; it
//! renders everything an agent wrote as text, never as HTML, and the
//! Content-Security-Policy allows no inline script and no other origin.

pub(crate) mod session;

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::Api;

/// The files, as built into the binary.
pub(crate) mod assets {
    pub(crate) const INDEX: &str = include_str!("assets/index.html");
    pub(crate) const SCRIPT: &str = include_str!("assets/app.js");
    pub(crate) const STYLE: &str = include_str!("assets/style.css");
    pub(crate) const REFUSED: &str = include_str!("assets/refused.html");
}

/// Scripts only from this origin and never inline, styles likewise, fetches
/// and the event stream only to this origin, no frames, no plugins, no
/// forms elsewhere: a name or transcript that slipped into the page as
/// markup still could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The UI's routes; authentication is the router's, in front of them.
pub(crate) fn pages() -> Router<Api> {
    Router::new()
        .route("/", get(root))
        .route("/ui", get(index))
        .route("/ui/app.js", get(script))
        .route("/ui/style.css", get(style))
        .route("/api/ui/logout", axum::routing::post(session::logout))
}

/// A UI file with the headers every one of them carries.
pub(crate) fn page(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn root() -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(LOCATION, HeaderValue::from_static("/ui"));
    r
}

async fn index() -> Response {
    page(
        StatusCode::OK,
        "text/html; charset=utf-8",
        assets::INDEX.to_owned(),
    )
}

async fn script() -> Response {
    page(
        StatusCode::OK,
        "text/javascript; charset=utf-8",
        assets::SCRIPT.to_owned(),
    )
}

async fn style() -> Response {
    page(
        StatusCode::OK,
        "text/css; charset=utf-8",
        assets::STYLE.to_owned(),
    )
}

/// Text for an HTML page of the server's own (the refusal's message).
pub(crate) fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_is_escaped() {
        assert_eq!(
            escape_html("<b a=\"x\">&'"),
            "&lt;b a=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn the_script_never_writes_markup() {
        // Agents' names, transcripts and results are hostile input: the
        // script builds nodes and sets textContent, never HTML.
        for bad in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!assets::SCRIPT.contains(bad), "app.js uses {bad}");
        }
        assert!(!assets::INDEX.contains("<script>"), "no inline script");
    }
}
