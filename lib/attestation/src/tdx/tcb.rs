//! The TCB status of a quote whose TD does not set SEPT_VE_DISABLE.
//!
//! dcap-qvl refuses such a TD as its very last check, after every signature, chain, CRL, QE and
//! TCB check has passed, and then returns no claims. Azure's TDs (run under Microsoft's
//! paravisor) never set the attribute, and Constellation does not require it there, so for exactly
//! that refusal the status is evaluated here from the crate's own public TCB-info and
//! QE-identity types, by the same rule (Intel's): the first TCB level, highest first, that the
//! PCK's CPUSVN and PCESVN and the TD's TEE_TCB_SVN meet (components 0 and 1 skipped when
//! TEE_TCB_SVN[1] > 0); the `TDX_%02X` module identity's first level the module ISVSVN meets;
//! the first QE identity level the QE's ISVSVN meets; the statuses converged and the advisory
//! IDs joined with the crate's `TcbStatusWithAdvisory::merge`. The tests check that this gives
//! the crate's own answer on every quote the crate accepts. Whether such a TD is accepted is
//! the config's decision ([`super::config::TdxConfig::check`]): on azure-tdx only.

use dcap_qvl::{QeIdentity, TcbInfo, TcbStatus, TcbStatusWithAdvisory};

use super::{Collateral, TdQuote, TdxError};

/// The TCB facts a verified quote gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Evaluated {
    pub status: TcbStatus,
    pub advisory_ids: Vec<String>,
    pub platform_status: TcbStatus,
    pub tcb_date: String,
    pub qe_status: TcbStatus,
}

pub(crate) fn evaluate(quote: &TdQuote, collateral: &Collateral) -> Result<Evaluated, TdxError> {
    let mut info: TcbInfo = serde_json::from_str(collateral.tcb_info_json())
        .map_err(|e| TdxError::Collateral(format!("the TCB info: {e}")))?;
    let qe: QeIdentity = serde_json::from_str(&collateral.dcap().qe_identity)
        .map_err(|e| TdxError::Collateral(format!("the QE identity: {e}")))?;
    let svn = |c: &[dcap_qvl::TcbComponents]| c.iter().map(|c| c.svn).collect::<Vec<u8>>();
    info.tcb_levels.sort_by(|a, b| {
        svn(&b.tcb.sgx_components)
            .cmp(&svn(&a.tcb.sgx_components))
            .then(b.tcb.pce_svn.cmp(&a.tcb.pce_svn))
            .then(svn(&b.tcb.tdx_components).cmp(&svn(&a.tcb.tdx_components)))
    });
    let tee = &quote.td().tee_tcb_svn;
    let (cpu_svn, pce_svn) = quote.pck_svns();
    let mut level = None;
    for candidate in &info.tcb_levels {
        let short = candidate
            .shortfalls(&cpu_svn, pce_svn, Some(tee))
            .map_err(|e| TdxError::Collateral(format!("the TCB info: {e:#}")))?;
        if short.is_empty() {
            level = Some(candidate);
            break;
        }
    }
    let level = level
        .ok_or_else(|| TdxError::NoTcbLevel("the PCK's and the TD's SVNs meet none".to_owned()))?;
    let mut platform = TcbStatusWithAdvisory::new(level.tcb_status, level.advisory_ids.clone());
    let mut tcb_date = level.tcb_date.clone();
    let module = info
        .tdx_module_identity(tee)
        .map_err(|e| TdxError::TdxModule(format!("{e:#}")))?;
    if let Some(module) = module {
        let module_level = module
            .tcb_levels
            .iter()
            .find(|l| l.shortfall(tee).is_none())
            .ok_or_else(|| {
                TdxError::TdxModule(format!(
                    "module ISVSVN {} is below every level of {}",
                    tee[0], module.id
                ))
            })?;
        platform = platform.merge(&TcbStatusWithAdvisory::new(
            module_level.tcb_status,
            module_level.advisory_ids.clone(),
        ));
        if module_level.tcb_date < tcb_date {
            tcb_date = module_level.tcb_date.clone();
        }
    }
    let qe_isvsvn = quote.qe_isvsvn();
    let qe_level = qe
        .tcb_levels
        .iter()
        .find(|l| qe_isvsvn >= l.tcb.isvsvn)
        .ok_or_else(|| {
            TdxError::QeIdentity(format!("QE ISVSVN {qe_isvsvn} is below every level"))
        })?;
    let merged = platform.clone().merge(&TcbStatusWithAdvisory::new(
        qe_level.tcb_status,
        qe_level.advisory_ids.clone(),
    ));
    if merged.status == TcbStatus::Revoked {
        return Err(TdxError::TcbRevoked);
    }
    Ok(Evaluated {
        status: merged.status,
        advisory_ids: merged.advisory_ids,
        platform_status: platform.status,
        tcb_date,
        qe_status: qe_level.tcb_status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tdx::{Trust, verify_quote};

    fn read(path: &str) -> Vec<u8> {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/tdx");
        std::fs::read(dir.join(path)).unwrap()
    }

    /// On a quote the crate accepts, this evaluation gives the crate's own answer.
    #[test]
    fn the_evaluation_agrees_with_dcap_qvl() {
        let collateral =
            Collateral::from_dcap_json(&read("dcap-qvl-uptodate/collateral.json")).unwrap();
        let quote = TdQuote::parse(&read("dcap-qvl-uptodate/quote.bin")).unwrap();
        assert!(
            quote.sept_ve_disable(),
            "the crate itself evaluates this one"
        );
        let crate_says = verify_quote(&quote, &collateral, &Trust::builtin(), 1750329147).unwrap();
        let ours = evaluate(&quote, &collateral).unwrap();
        assert_eq!(
            ours,
            Evaluated {
                status: crate_says.status,
                advisory_ids: crate_says.advisory_ids,
                platform_status: crate_says.platform_status,
                tcb_date: crate_says.tcb_date,
                qe_status: crate_says.qe_status,
            }
        );
        assert_eq!(ours.status, TcbStatus::UpToDate);
    }
}
