// The error codes of CUDA 13's driver_types.h. Descriptions are the model's own words for the
// errors it produces; the others describe themselves by name.

#include "model/names.hpp"

namespace hss::cuda_model::detail {

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorAddressOfConstant:
      return "cudaErrorAddressOfConstant";
    case cudaErrorAlreadyAcquired:
      return "cudaErrorAlreadyAcquired";
    case cudaErrorAlreadyMapped:
      return "cudaErrorAlreadyMapped";
    case cudaErrorArrayIsMapped:
      return "cudaErrorArrayIsMapped";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorCallRequiresNewerDriver:
      return "cudaErrorCallRequiresNewerDriver";
    case cudaErrorCapturedEvent:
      return "cudaErrorCapturedEvent";
    case cudaErrorCdpNotSupported:
      return "cudaErrorCdpNotSupported";
    case cudaErrorCdpVersionMismatch:
      return "cudaErrorCdpVersionMismatch";
    case cudaErrorCompatNotSupportedOnDevice:
      return "cudaErrorCompatNotSupportedOnDevice";
    case cudaErrorContained:
      return "cudaErrorContained";
    case cudaErrorContextIsDestroyed:
      return "cudaErrorContextIsDestroyed";
    case cudaErrorCooperativeLaunchTooLarge:
      return "cudaErrorCooperativeLaunchTooLarge";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    case cudaErrorDeviceAlreadyInUse:
      return "cudaErrorDeviceAlreadyInUse";
    case cudaErrorDeviceNotLicensed:
      return "cudaErrorDeviceNotLicensed";
    case cudaErrorDeviceUninitialized:
      return "cudaErrorDeviceUninitialized";
    case cudaErrorDevicesUnavailable:
      return "cudaErrorDevicesUnavailable";
    case cudaErrorDuplicateSurfaceName:
      return "cudaErrorDuplicateSurfaceName";
    case cudaErrorDuplicateTextureName:
      return "cudaErrorDuplicateTextureName";
    case cudaErrorDuplicateVariableName:
      return "cudaErrorDuplicateVariableName";
    case cudaErrorECCUncorrectable:
      return "cudaErrorECCUncorrectable";
    case cudaErrorExternalDevice:
      return "cudaErrorExternalDevice";
    case cudaErrorFileNotFound:
      return "cudaErrorFileNotFound";
    case cudaErrorFunctionNotLoaded:
      return "cudaErrorFunctionNotLoaded";
    case cudaErrorGraphExecUpdateFailure:
      return "cudaErrorGraphExecUpdateFailure";
    case cudaErrorHardwareStackError:
      return "cudaErrorHardwareStackError";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorIncompatibleDriverContext:
      return "cudaErrorIncompatibleDriverContext";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidAddressSpace:
      return "cudaErrorInvalidAddressSpace";
    case cudaErrorInvalidChannelDescriptor:
      return "cudaErrorInvalidChannelDescriptor";
    case cudaErrorInvalidClusterSize:
      return "cudaErrorInvalidClusterSize";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidFilterSetting:
      return "cudaErrorInvalidFilterSetting";
    case cudaErrorInvalidGraphicsContext:
      return "cudaErrorInvalidGraphicsContext";
    case cudaErrorInvalidHostPointer:
      return "cudaErrorInvalidHostPointer";
    case cudaErrorInvalidKernelImage:
      return "cudaErrorInvalidKernelImage";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidNormSetting:
      return "cudaErrorInvalidNormSetting";
    case cudaErrorInvalidPc:
      return "cudaErrorInvalidPc";
    case cudaErrorInvalidPitchValue:
      return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidPtx:
      return "cudaErrorInvalidPtx";
    case cudaErrorInvalidResourceConfiguration:
      return "cudaErrorInvalidResourceConfiguration";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidResourceType:
      return "cudaErrorInvalidResourceType";
    case cudaErrorInvalidSource:
      return "cudaErrorInvalidSource";
    case cudaErrorInvalidSurface:
      return "cudaErrorInvalidSurface";
    case cudaErrorInvalidSymbol:
      return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidTexture:
      return "cudaErrorInvalidTexture";
    case cudaErrorInvalidTextureBinding:
      return "cudaErrorInvalidTextureBinding";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorJitCompilationDisabled:
      return "cudaErrorJitCompilationDisabled";
    case cudaErrorJitCompilerNotFound:
      return "cudaErrorJitCompilerNotFound";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchFileScopedSurf:
      return "cudaErrorLaunchFileScopedSurf";
    case cudaErrorLaunchFileScopedTex:
      return "cudaErrorLaunchFileScopedTex";
    case cudaErrorLaunchIncompatibleTexturing:
      return "cudaErrorLaunchIncompatibleTexturing";
    case cudaErrorLaunchMaxDepthExceeded:
      return "cudaErrorLaunchMaxDepthExceeded";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchPendingCountExceeded:
      return "cudaErrorLaunchPendingCountExceeded";
    case cudaErrorLaunchTimeout:
      return "cudaErrorLaunchTimeout";
    case cudaErrorLossyQuery:
      return "cudaErrorLossyQuery";
    case cudaErrorMapBufferObjectFailed:
      return "cudaErrorMapBufferObjectFailed";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorMemoryValueTooLarge:
      return "cudaErrorMemoryValueTooLarge";
    case cudaErrorMisalignedAddress:
      return "cudaErrorMisalignedAddress";
    case cudaErrorMissingConfiguration:
      return "cudaErrorMissingConfiguration";
    case cudaErrorMixedDeviceExecution:
      return "cudaErrorMixedDeviceExecution";
    case cudaErrorMpsClientTerminated:
      return "cudaErrorMpsClientTerminated";
    case cudaErrorMpsConnectionFailed:
      return "cudaErrorMpsConnectionFailed";
    case cudaErrorMpsMaxClientsReached:
      return "cudaErrorMpsMaxClientsReached";
    case cudaErrorMpsMaxConnectionsReached:
      return "cudaErrorMpsMaxConnectionsReached";
    case cudaErrorMpsRpcFailure:
      return "cudaErrorMpsRpcFailure";
    case cudaErrorMpsServerNotReady:
      return "cudaErrorMpsServerNotReady";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNoKernelImageForDevice:
      return "cudaErrorNoKernelImageForDevice";
    case cudaErrorNotMapped:
      return "cudaErrorNotMapped";
    case cudaErrorNotMappedAsArray:
      return "cudaErrorNotMappedAsArray";
    case cudaErrorNotMappedAsPointer:
      return "cudaErrorNotMappedAsPointer";
    case cudaErrorNotPermitted:
      return "cudaErrorNotPermitted";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorNotYetImplemented:
      return "cudaErrorNotYetImplemented";
    case cudaErrorNvlinkUncorrectable:
      return "cudaErrorNvlinkUncorrectable";
    case cudaErrorOperatingSystem:
      return "cudaErrorOperatingSystem";
    case cudaErrorPeerAccessAlreadyEnabled:
      return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorPeerAccessNotEnabled:
      return "cudaErrorPeerAccessNotEnabled";
    case cudaErrorPeerAccessUnsupported:
      return "cudaErrorPeerAccessUnsupported";
    case cudaErrorPriorLaunchFailure:
      return "cudaErrorPriorLaunchFailure";
    case cudaErrorProfilerAlreadyStarted:
      return "cudaErrorProfilerAlreadyStarted";
    case cudaErrorProfilerAlreadyStopped:
      return "cudaErrorProfilerAlreadyStopped";
    case cudaErrorProfilerDisabled:
      return "cudaErrorProfilerDisabled";
    case cudaErrorProfilerNotInitialized:
      return "cudaErrorProfilerNotInitialized";
    case cudaErrorSetOnActiveProcess:
      return "cudaErrorSetOnActiveProcess";
    case cudaErrorSharedObjectInitFailed:
      return "cudaErrorSharedObjectInitFailed";
    case cudaErrorSharedObjectSymbolNotFound:
      return "cudaErrorSharedObjectSymbolNotFound";
    case cudaErrorSoftwareValidityNotEstablished:
      return "cudaErrorSoftwareValidityNotEstablished";
    case cudaErrorStartupFailure:
      return "cudaErrorStartupFailure";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureMerge:
      return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureWrongThread:
      return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorStubLibrary:
      return "cudaErrorStubLibrary";
    case cudaErrorSymbolNotFound:
      return "cudaErrorSymbolNotFound";
    case cudaErrorSyncDepthExceeded:
      return "cudaErrorSyncDepthExceeded";
    case cudaErrorSynchronizationError:
      return "cudaErrorSynchronizationError";
    case cudaErrorSystemDriverMismatch:
      return "cudaErrorSystemDriverMismatch";
    case cudaErrorSystemNotReady:
      return "cudaErrorSystemNotReady";
    case cudaErrorTensorMemoryLeak:
      return "cudaErrorTensorMemoryLeak";
    case cudaErrorTextureFetchFailed:
      return "cudaErrorTextureFetchFailed";
    case cudaErrorTextureNotBound:
      return "cudaErrorTextureNotBound";
    case cudaErrorTimeout:
      return "cudaErrorTimeout";
    case cudaErrorTooManyPeers:
      return "cudaErrorTooManyPeers";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
    case cudaErrorUnmapBufferObjectFailed:
      return "cudaErrorUnmapBufferObjectFailed";
    case cudaErrorUnsupportedDevSideSync:
      return "cudaErrorUnsupportedDevSideSync";
    case cudaErrorUnsupportedExecAffinity:
      return "cudaErrorUnsupportedExecAffinity";
    case cudaErrorUnsupportedLimit:
      return "cudaErrorUnsupportedLimit";
    case cudaErrorUnsupportedPtxVersion:
      return "cudaErrorUnsupportedPtxVersion";
    default:
      return "unrecognized error code";
  }
}

const char* error_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
    case cudaErrorNotPermitted:
      return "operation not permitted";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined:
      return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    default:
      return error_name(e);
  }
}

}  // namespace hss::cuda_model::detail
