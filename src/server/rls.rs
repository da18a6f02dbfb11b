//! `ShouldRateLimit`, served without tonic's router and codec: the one
//! call on the hot path reads its gRPC message straight from the HTTP/2
//! body, calls the service, and answers with one DATA frame and the status
//! trailers. tonic's generic machinery around a unary call (a boxed router
//! service, a streaming decoder, an encoding body) cost more CPU than the
//! decision itself; every other gRPC method still goes through tonic.
//!
//! The answers are tonic's, as a client sees them: a message over the cap
//! is refused RESOURCE_EXHAUSTED on its length prefix; one that does not
//! decode, or is flagged compressed while no `grpc-encoding` says how, is
//! INVALID_ARGUMENT (tonic's INTERNAL, as `grpc.rs` rewrites it); a
//! `grpc-encoding` other than `identity` is UNIMPLEMENTED with the
//! encodings offered; and each is counted as `grpc.rs` counts tonic's
//! refusals.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as _, Frame};
use hyper::body::Incoming;
use prost::Message as _;
use tonic::body::Body;
use tonic::metadata::MetadataMap;

use crate::proto as pb;
use crate::telemetry::metrics::InvalidRequestCounters;

/// The gRPC message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// The service behind `ShouldRateLimit`, as tonic's generated trait.
pub(crate) type RlsService = Arc<dyn pb::RateLimitService>;

/// Answers one `ShouldRateLimit` request.
pub(crate) async fn answer(
    service: &RlsService,
    request: Request<Incoming>,
    max_request_bytes: usize,
    invalid: &InvalidRequestCounters,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    if let Some(encoding) = parts.headers.get("grpc-encoding")
        && encoding != "identity"
    {
        return Refusal::Encoding(encoding.clone()).answer(invalid);
    }
    let message = match read_message(body, max_request_bytes).await {
        Ok(message) => message,
        Err(refusal) => return refusal.answer(invalid),
    };
    let request = match pb::RateLimitRequest::decode(message) {
        Ok(request) => request,
        Err(e) => {
            return Refusal::Decode(format!("failed to decode Protobuf message: {e}"))
                .answer(invalid);
        }
    };
    let request = tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        request,
    );
    match service.should_rate_limit(request).await {
        Ok(response) => unary(&response.into_inner()),
        Err(status) => status.into_http(),
    }
}

/// Why a request was answered before the service saw it.
enum Refusal {
    /// Not a protobuf message, truncated, or missing.
    Decode(String),
    /// Declared larger than the cap.
    TooLarge(usize),
    /// Sent with a `grpc-encoding` that is not offered (none is but
    /// `identity`).
    Encoding(HeaderValue),
    /// The body could not be read (the client reset the stream).
    Body(String),
}

impl Refusal {
    fn answer(self, invalid: &InvalidRequestCounters) -> Response<Body> {
        let status = match self {
            Refusal::Decode(message) => {
                invalid.decode.inc();
                invalid.rls_invalid_argument.inc();
                tonic::Status::invalid_argument(message)
            }
            Refusal::TooLarge(length) => {
                invalid.too_large.inc();
                tonic::Status::resource_exhausted(format!(
                    "message of {length} bytes is over the limit"
                ))
            }
            Refusal::Encoding(encoding) => {
                let mut answer = tonic::Status::unimplemented(format!(
                    "grpc-encoding {encoding:?} is not supported (only identity is)"
                ))
                .into_http();
                answer
                    .headers_mut()
                    .insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
                return answer;
            }
            Refusal::Body(why) => tonic::Status::cancelled(why),
        };
        status.into_http()
    }
}

/// The first message of a unary call's body, refused on its length prefix
/// when over `max` bytes. Whatever follows it is not read.
async fn read_message(mut body: Incoming, max: usize) -> Result<Bytes, Refusal> {
    let mut buffer = BytesMut::new();
    let mut wanted: Option<usize> = None;
    loop {
        if wanted.is_none() && buffer.len() >= PREFIX {
            if buffer[0] != 0 {
                return Err(Refusal::Decode(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified"
                        .to_owned(),
                ));
            }
            let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if length > max {
                return Err(Refusal::TooLarge(length));
            }
            wanted = Some(length);
        }
        if let Some(length) = wanted
            && buffer.len() >= PREFIX + length
        {
            buffer.advance(PREFIX);
            return Ok(buffer.split_to(length).freeze());
        }
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buffer.put(data);
                }
            }
            Some(Err(e)) => return Err(Refusal::Body(e.to_string())),
            None => {
                return Err(Refusal::Decode(if buffer.is_empty() {
                    "Missing request message".to_owned()
                } else {
                    "Unexpected EOF decoding stream".to_owned()
                }));
            }
        }
    }
}

/// A successful unary answer: `message` in one DATA frame, then the OK
/// status as trailers.
fn unary(message: &pb::RateLimitResponse) -> Response<Body> {
    let length = message.encoded_len();
    let mut data = BytesMut::with_capacity(PREFIX + length);
    data.put_u8(0);
    data.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message
        .encode(&mut data)
        .expect("the buffer was sized for the message");
    let mut response = Response::new(Body::new(Unary {
        data: Some(data.freeze()),
        trailers: true,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// One message, then `grpc-status: 0`.
struct Unary {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for Unary {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }
}
