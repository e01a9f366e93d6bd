//! Request ids that differ between processes. rmcp numbers a client's requests from 0 in
//! every connection, and its numbering cannot be replaced. A call whose server asked a question
//! is answered from a new process (`vaultd once`, or a restarted daemon: docs/design.md §10.4
//! "A server that asks a person"), so the answered round could carry the very id of the round
//! that asked, which a 2026-07-28 server may take for a replay (SEP-2322: a retry is a new
//! request). [`FreshIds`] wraps a transport and adds one random offset per connection to the id
//! of every request vaultd sends, and takes it off every response and error that comes back.
//!
//! The server's own requests (roots, questions) keep the server's ids, and so do vaultd's
//! answers to them; a `notifications/cancelled` vaultd sends names one of vaultd's requests and
//! is shifted like it. Ids stay below 2^31, so a server that reads ids as 32-bit integers reads
//! them.

use rmcp::model::{ClientNotification, GetExtensions, JsonRpcMessage, NumberOrString, RequestId};
use rmcp::service::{InboundStreamOrigin, RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::hash::{BuildHasher, Hasher};

/// The largest offset: rmcp's own count then has a billion ids before it reaches 2^31.
const MAX_OFFSET: u64 = 1 << 30;

/// A transport whose outgoing request ids are shifted by one offset, and whose responses are
/// shifted back before rmcp sees them.
pub(crate) struct FreshIds<T> {
    inner: T,
    offset: i64,
}

impl<T> FreshIds<T> {
    /// `inner` with a random offset in `1..2^30`.
    pub(crate) fn new(inner: T) -> Self {
        // RandomState's keys are random per process and per call: enough to tell two
        // processes' connections apart, without a crate for it.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let offset = (random % (MAX_OFFSET - 1) + 1) as i64;
        FreshIds { inner, offset }
    }
}

fn shift(id: &mut RequestId, by: i64) {
    if let NumberOrString::Number(n) = id {
        *n = n.wrapping_add(by);
    }
}

/// Shifts the ids of vaultd's own requests, and of a cancellation naming one of them.
fn outgoing(message: &mut TxJsonRpcMessage<RoleClient>, offset: i64) {
    match message {
        JsonRpcMessage::Request(request) => shift(&mut request.id, offset),
        JsonRpcMessage::Notification(note) => {
            if let ClientNotification::CancelledNotification(cancelled) = &mut note.notification
                && let Some(id) = &mut cancelled.params.request_id
            {
                shift(id, offset);
            }
        }
        JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
    }
}

/// Takes the offset off answers to vaultd's requests, and off the note that tells rmcp which
/// of its requests' streams a server request came on (streamable HTTP).
fn incoming(message: &mut RxJsonRpcMessage<RoleClient>, offset: i64) {
    match message {
        JsonRpcMessage::Response(response) => shift(&mut response.id, -offset),
        JsonRpcMessage::Error(error) => {
            if let Some(id) = &mut error.id {
                shift(id, -offset);
            }
        }
        JsonRpcMessage::Request(request) => {
            if let Some(InboundStreamOrigin::OutboundRequest(id)) = request
                .request
                .extensions_mut()
                .get_mut::<InboundStreamOrigin>()
            {
                shift(id, -offset);
            }
        }
        JsonRpcMessage::Notification(_) => {}
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for FreshIds<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        outgoing(&mut item, self.offset);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut message = self.inner.receive().await?;
        incoming(&mut message, self.offset);
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tx(value: serde_json::Value) -> TxJsonRpcMessage<RoleClient> {
        serde_json::from_value(value).unwrap()
    }

    fn rx(value: serde_json::Value) -> RxJsonRpcMessage<RoleClient> {
        serde_json::from_value(value).unwrap()
    }

    fn json_of<M: serde::Serialize>(message: &M) -> serde_json::Value {
        serde_json::to_value(message).unwrap()
    }

    #[test]
    fn own_requests_and_their_cancellation_are_shifted_answers_to_the_server_are_not() {
        let mut call = tx(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "t", "arguments": {}}}));
        outgoing(&mut call, 1000);
        assert_eq!(json_of(&call)["id"], 1003);

        let mut cancel = tx(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 3, "reason": "timeout"}}),
        );
        outgoing(&mut cancel, 1000);
        assert_eq!(json_of(&cancel)["params"]["requestId"], 1003);

        let mut answer = tx(json!({"jsonrpc": "2.0", "id": 7, "result": {"roots": []}}));
        outgoing(&mut answer, 1000);
        assert_eq!(json_of(&answer)["id"], 7, "an answer keeps the server's id");

        let mut named = tx(json!({"jsonrpc": "2.0", "id": "abc", "method": "ping"}));
        outgoing(&mut named, 1000);
        assert_eq!(json_of(&named)["id"], "abc", "string ids are left alone");
    }

    #[test]
    fn answers_are_shifted_back_the_servers_requests_are_not() {
        let mut result = rx(json!({"jsonrpc": "2.0", "id": 1003, "result": {}}));
        incoming(&mut result, 1000);
        assert_eq!(json_of(&result)["id"], 3);

        let mut error = rx(json!({"jsonrpc": "2.0", "id": 1003,
            "error": {"code": -32601, "message": "no"}}));
        incoming(&mut error, 1000);
        assert_eq!(json_of(&error)["id"], 3);

        let mut ask = rx(json!({"jsonrpc": "2.0", "id": 5, "method": "roots/list"}));
        if let JsonRpcMessage::Request(r) = &mut ask {
            r.request
                .extensions_mut()
                .insert(InboundStreamOrigin::OutboundRequest(RequestId::Number(
                    1003,
                )));
        }
        incoming(&mut ask, 1000);
        let JsonRpcMessage::Request(r) = &ask else {
            panic!("a request")
        };
        assert_eq!(r.id, RequestId::Number(5), "the server's own id is kept");
        assert_eq!(
            r.request.extensions().get::<InboundStreamOrigin>(),
            Some(&InboundStreamOrigin::OutboundRequest(RequestId::Number(3)))
        );
    }

    #[test]
    fn two_connections_number_their_requests_differently() {
        let a = FreshIds::new(());
        let b = FreshIds::new(());
        assert!((1..MAX_OFFSET as i64).contains(&a.offset));
        assert_ne!(a.offset, b.offset);
    }
}
