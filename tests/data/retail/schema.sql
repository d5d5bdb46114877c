CREATE TABLE today (id INTEGER PRIMARY KEY CHECK (id = 1), d TEXT NOT NULL);
CREATE TABLE users (
  user_id TEXT NOT NULL PRIMARY KEY,
  name TEXT NOT NULL,
  email TEXT NOT NULL,
  address TEXT NOT NULL,
  tier TEXT NOT NULL CHECK (tier IN ('basic','vip'))
);
CREATE TABLE product (sku TEXT NOT NULL PRIMARY KEY, title TEXT NOT NULL, price REAL NOT NULL, stock INTEGER NOT NULL CHECK (stock >= 0));
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  user_id TEXT NOT NULL REFERENCES users(user_id),
  sku TEXT NOT NULL REFERENCES product(sku),
  qty INTEGER NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending','shipped','delivered','cancelled','returned')),
  placed_on TEXT,
  delivered_on TEXT
);
CREATE TABLE gift_card (card_id TEXT NOT NULL PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(user_id), balance REAL NOT NULL);
CREATE TABLE charge (charge_id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(order_id), card_id TEXT NOT NULL REFERENCES gift_card(card_id), amount REAL NOT NULL);

CREATE TRIGGER orders_new BEFORE INSERT ON orders BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: qty_range: between 1 and 3 units per order, 10 for vip customers')
  WHERE NEW.qty < 1 OR NEW.qty > CASE (SELECT tier FROM users WHERE user_id = NEW.user_id) WHEN 'vip' THEN 10 ELSE 3 END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: in_stock: the product must have enough stock')
  WHERE (SELECT stock FROM product WHERE sku = NEW.sku) < NEW.qty;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pending_first: new orders start pending')
  WHERE NEW.status != 'pending';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: open_orders_cap: at most 2 pending orders per customer')
  WHERE (SELECT COUNT(*) FROM orders WHERE user_id = NEW.user_id AND status = 'pending') >= 2;
END;
CREATE TRIGGER orders_after_new AFTER INSERT ON orders BEGIN
  -- stock is reserved and the order date set
  UPDATE product SET stock = stock - NEW.qty WHERE sku = NEW.sku;
  UPDATE orders SET placed_on = (SELECT d FROM today) WHERE order_id = NEW.order_id;
END;
CREATE TRIGGER orders_status BEFORE UPDATE OF status ON orders WHEN NEW.status IS NOT OLD.status BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancel_pending_only: only pending orders can be cancelled')
  WHERE NEW.status = 'cancelled' AND OLD.status != 'pending';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: return_window: delivered orders can be returned within 30 days of delivery')
  WHERE NEW.status = 'returned' AND (OLD.status != 'delivered' OR julianday((SELECT d FROM today)) - julianday(OLD.delivered_on) > 30);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: final_states: cancelled and returned orders are final')
  WHERE OLD.status IN ('cancelled','returned');
END;
CREATE TRIGGER orders_qty_fixed BEFORE UPDATE OF qty, sku, user_id ON orders BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: order_fixed: quantity, product and customer of an order cannot change')
  WHERE NEW.qty IS NOT OLD.qty OR NEW.sku IS NOT OLD.sku OR NEW.user_id IS NOT OLD.user_id;
END;
CREATE TRIGGER orders_restock AFTER UPDATE OF status ON orders WHEN NEW.status IN ('cancelled','returned') BEGIN
  -- the units go back to stock
  UPDATE product SET stock = stock + OLD.qty WHERE sku = OLD.sku;
END;
CREATE TRIGGER charge_rules BEFORE INSERT ON charge BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: card_owner: the gift card must belong to the customer of the order')
  WHERE (SELECT user_id FROM gift_card WHERE card_id = NEW.card_id) IS NOT (SELECT user_id FROM orders WHERE order_id = NEW.order_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: card_balance: the card balance must cover the charge')
  WHERE (SELECT balance FROM gift_card WHERE card_id = NEW.card_id) < NEW.amount;
END;
CREATE TRIGGER charge_after AFTER INSERT ON charge BEGIN
  -- the card balance goes down
  UPDATE gift_card SET balance = balance - NEW.amount WHERE card_id = NEW.card_id;
END;
CREATE TRIGGER users_rules BEFORE UPDATE ON users BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: tier_locked: the tier cannot be changed by an agent')
  WHERE NEW.tier IS NOT OLD.tier;
END;
