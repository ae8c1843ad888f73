//! `nri-accel cleanup`: deletes the ResourceSlices this driver published for this node.
//!
//! Run after the daemon stopped (package removal stops it first): a running publisher would
//! publish them again. Slices are also owned by the Node object, so deleting the Node deletes
//! them without us.

use std::time::Duration;

use super::publisher::call;
use super::{KubeApi, KubeError};

/// Deletes every ResourceSlice of `driver` on `node`; returns how many were deleted. A slice
/// that changed while being deleted is listed again (three tries).
pub async fn delete_slices(
    api: &dyn KubeApi,
    driver: &str,
    node: &str,
    timeout: Duration,
) -> Result<usize, KubeError> {
    let mut deleted = 0;
    let what = format!("the ResourceSlices of node {node}");
    for attempt in 0..3 {
        let slices = call(timeout, &what, api.list_slices(driver, node)).await?;
        if slices.is_empty() {
            return Ok(deleted);
        }
        let mut conflict = None;
        for s in &slices {
            let name = s.metadata.name.as_deref().unwrap_or("");
            let rv = s.metadata.resource_version.as_deref().unwrap_or("");
            let one = format!("ResourceSlice {name}");
            match call(timeout, &one, api.delete_slice(name, rv)).await {
                Ok(()) => deleted += 1,
                Err(KubeError::NotFound { .. }) => {}
                Err(e @ KubeError::Conflict { .. }) if attempt < 2 => conflict = Some(e),
                Err(e) => return Err(e),
            }
        }
        if conflict.is_none() {
            return Ok(deleted);
        }
    }
    Ok(deleted)
}
