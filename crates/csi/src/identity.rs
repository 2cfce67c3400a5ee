//! The CSI Identity service: the driver's name and version, what it offers, and whether it
//! is ready (its daemon answers `/readyz`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::daemon::Daemon;
use crate::pb;

/// The driver's name, as a CSIDriver object and StorageClasses name it.
pub const DRIVER_NAME: &str = "csi.glidefs.io";

/// The identity service.
#[derive(Debug, Clone)]
pub struct Identity {
    pub(crate) daemon: Arc<dyn Daemon>,
    /// Whether this process serves the controller too.
    pub(crate) controller: bool,
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _request: Request<pb::GetPluginInfoRequest>,
    ) -> Answer<pb::GetPluginInfoResponse> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Answer<pb::GetPluginCapabilitiesResponse> {
        use pb::plugin_capability::{service, volume_expansion, Service, Type, VolumeExpansion};
        let mut caps = vec![pb::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        }];
        if self.controller {
            caps.push(pb::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            });
        }
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: caps,
        }))
    }

    async fn probe(&self, _request: Request<pb::ProbeRequest>) -> Answer<pb::ProbeResponse> {
        let ready = match self.daemon.ready().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "probe: the daemon does not answer");
                false
            }
        };
        Ok(Response::new(pb::ProbeResponse { ready: Some(ready) }))
    }
}
