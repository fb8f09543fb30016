"""Bearer tokens from an identity provider (OIDC access tokens, JWTs), beside the service's own API keys.

With ``MIRSERVE_OIDC_ISSUER``, ``MIRSERVE_OIDC_JWKS_URL`` and ``MIRSERVE_OIDC_AUDIENCE`` set, a bearer token
that is not a mirserve key is checked as a JWT with PyJWT: signed by a key of the JWKS (fetched and cached by
PyJWT's client, asymmetric algorithms only), issued by the issuer for the audience, unexpired. Its owner is the
``sub`` claim (``MIRSERVE_OIDC_OWNER_CLAIM``); it is an admin when its roles claim (``MIRSERVE_OIDC_ROLES_CLAIM``,
a list or a space-separated string) holds ``MIRSERVE_OIDC_ADMIN_ROLE``.
"""
from __future__ import annotations

import jwt

from app.settings import Settings

#: Never "none" or an HMAC algorithm: the JWKS is public, so only signatures it can check are accepted.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY_SECONDS = 30
MAX_OWNER = 200


class OidcVerifier:
    def __init__(self, settings: Settings):
        self.issuer, self.audience = settings.oidc_issuer, settings.oidc_audience
        self.owner_claim, self.roles_claim = settings.oidc_owner_claim, settings.oidc_roles_claim
        self.admin_role = settings.oidc_admin_role
        self.jwks = jwt.PyJWKClient(settings.oidc_jwks_url, cache_keys=True, lifespan=300, timeout=5)

    def authenticate(self, token: str) -> tuple[str, bool] | str:
        """(owner, is_admin) of a valid token, or why it is refused (a sentence)."""
        try:
            key = self.jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=ALGORITHMS, issuer=self.issuer, audience=self.audience,
                                leeway=LEEWAY_SECONDS, options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWKClientConnectionError:
            return "the identity provider's signing keys cannot be fetched; try again later"
        except (jwt.PyJWKClientError, jwt.InvalidTokenError) as error:
            return f"the token is not valid: {error}"
        owner = claims.get(self.owner_claim)
        if not isinstance(owner, str) or not owner or len(owner) > MAX_OWNER or not owner.isprintable():
            return f"the token's {self.owner_claim!r} claim does not name an owner"
        roles = claims.get(self.roles_claim) or []
        if isinstance(roles, str):
            roles = roles.split()
        return owner, isinstance(roles, list) and self.admin_role in roles
