// A real OpenID Connect provider for the tests: panva's `oidc-provider` (OpenID Certified), with
// its own users, a `groups` claim, confidential clients, PKCE required, and its development login
// page (any password; the login must be one of its users). Started by tests/support/oidc_provider.py
// as `node oidc_provider.mjs <config.json>`; it prints `listening <port>` once it serves.
//
// The config file holds: issuer, port, clients, the signing keys (private JWKs: restarting with
// other keys rotates them), the path of the users file (read at every look-up, so that a test
// disables or changes a user by rewriting it) and the path of the store file (grants, sessions
// and refresh tokens survive a restart, as a production provider's database would).
import fs from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function readUsers() {
  return JSON.parse(fs.readFileSync(config.users_file, 'utf8'));
}

// A file-backed adapter: every model in one JSON object, written through on each change.
let store = {};
try { store = JSON.parse(fs.readFileSync(config.store_file, 'utf8')); } catch { store = {}; }
function save() { fs.writeFileSync(config.store_file, JSON.stringify(store)); }
function now() { return Math.floor(Date.now() / 1000); }

class FileAdapter {
  constructor(name) { this.name = name; }
  key(id) { return `${this.name}:${id}`; }
  async upsert(id, payload, expiresIn) {
    store[this.key(id)] = { payload, exp: expiresIn ? now() + expiresIn : null };
    if (payload.grantId) {
      const grantKey = `grant:${payload.grantId}`;
      store[grantKey] = { payload: [...new Set([...(store[grantKey]?.payload || []), this.key(id)])], exp: null };
    }
    if (payload.userCode) store[`userCode:${payload.userCode}`] = { payload: id, exp: null };
    if (payload.uid) store[`uid:${payload.uid}`] = { payload: id, exp: null };
    save();
  }
  async find(id) {
    const found = store[this.key(id)];
    if (!found || (found.exp && found.exp < now())) return undefined;
    return found.payload;
  }
  async findByUserCode(userCode) {
    const id = store[`userCode:${userCode}`]?.payload;
    return id ? this.find(id) : undefined;
  }
  async findByUid(uid) {
    const id = store[`uid:${uid}`]?.payload;
    return id ? this.find(id) : undefined;
  }
  async consume(id) {
    const found = store[this.key(id)];
    if (found) { found.payload.consumed = now(); save(); }
  }
  async destroy(id) { delete store[this.key(id)]; save(); }
  async revokeByGrantId(grantId) {
    for (const key of store[`grant:${grantId}`]?.payload || []) delete store[key];
    delete store[`grant:${grantId}`];
    save();
  }
}

const provider = new Provider(config.issuer, {
  adapter: FileAdapter,
  clients: config.clients,
  jwks: { keys: config.keys },
  cookies: { keys: [config.cookie_key] },
  pkce: { required: () => true },
  scopes: ['openid', 'offline_access', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  // Claims in the ID token itself (as Keycloak and Okta put groups there), not only userinfo.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  ttl: {
    AccessToken: config.access_token_ttl,
    IdToken: config.access_token_ttl,
    RefreshToken: 86400,
    Grant: 86400,
    Session: 86400,
    Interaction: 600,
    AuthorizationCode: 60,
  },
  // Refresh tokens for every client that may use them, as Keycloak issues them by default.
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  rotateRefreshToken: true,
  // First-party clients: consent is implied, so the only page a user sees is the login.
  loadExistingGrant: async (ctx) => {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) {
      const existing = await ctx.oidc.provider.Grant.find(grantId);
      if (existing) return existing;
    }
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid offline_access email profile groups');
    await grant.save();
    return grant;
  },
  // A disabled or unknown user has no account: their refresh fails with invalid_grant.
  findAccount: async (_ctx, id) => {
    const user = readUsers()[id];
    if (!user || user.disabled) return undefined;
    return {
      accountId: id,
      claims: async () => ({
        sub: id,
        email: user.email,
        email_verified: true,
        name: user.name,
        preferred_username: id,
        groups: user.groups || [],
      }),
    };
  },
});
provider.proxy = false;
provider.on('server_error', (_ctx, err) => { console.error('server_error', err); });

const server = provider.listen(config.port, config.host, () => {
  console.log(`listening ${server.address().port}`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
