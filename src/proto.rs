//! Generated protobuf and gRPC code for Envoy's RLS v3, RLQS v3 and ADS (SotW)
//! APIs, and upstream ratelimit's xDS rule format; nothing else.
//!
//! The modules mirror the protobuf packages because the generated code refers
//! across packages by relative path. The rest of the crate uses the short
//! aliases at the bottom (`pb::RateLimitRequest`, …); only the protocol
//! adapters touch these types: `service`, `server`, `rlqs::service`, `xds`,
//! and the `query` and `bench` clients.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
}

/// `google.rpc.Status`, the `error_detail` of an xDS NACK.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// envoyproxy/ratelimit's rule format over xDS (`RateLimitConfig`), used only by `xds`.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor};
pub use envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response,
    rate_limit_service_client::RateLimitServiceClient,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
pub use envoy::r#type::v3::RateLimitUnit;

/// The Rate Limit Quota Service (RLQS) types, used only by `rlqs::service`.
pub mod rlqs {
    pub use super::envoy::service::rate_limit_quota::v3::*;
    pub use super::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
}

/// Fully qualified name of the gRPC service, as health checks and Envoy name it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The encoded descriptor set of every file above, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor.bin"));
