"""The admission webhook: AdmissionReview handlers (`handlers`), the HTTPS and health servers
(`server`) and the self-made serving certificate (`certs`). Answers from memory only: this
package never imports the Kubernetes adapter.
"""

from controller.admission.certs import CertificateKeeper, KeyPair, ServingTLS, make_ca, make_serving_cert, needs_renewal
from controller.admission.handlers import Admission, MalformedReview
from controller.admission.server import AdmissionServer
from controller.event_sink import EventSink

__all__ = [
    "Admission",
    "AdmissionServer",
    "CertificateKeeper",
    "EventSink",
    "KeyPair",
    "MalformedReview",
    "ServingTLS",
    "make_ca",
    "make_serving_cert",
    "needs_renewal",
]
