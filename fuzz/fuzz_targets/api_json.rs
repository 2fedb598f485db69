//! The local API's JSON, as the daemon reads requests and the plugin reads answers: anything
//! either side accepts survives a round trip unchanged.
#![no_main]

use ipam_api::types::{Envelope, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<Envelope<Request>>(data) {
        let again = serde_json::to_vec(&request).expect("requests serialise");
        let back: Envelope<Request> = serde_json::from_slice(&again).expect("round trip");
        assert_eq!(back, request);
    }
    if let Ok(response) = serde_json::from_slice::<Envelope<Response>>(data) {
        let again = serde_json::to_vec(&response).expect("responses serialise");
        let back: Envelope<Response> = serde_json::from_slice(&again).expect("round trip");
        assert_eq!(back, response);
    }
});
